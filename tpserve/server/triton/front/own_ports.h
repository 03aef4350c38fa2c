/* own_ports: see own_ports.c. */
#ifndef OWN_PORTS_H
#define OWN_PORTS_H


/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

/* Reads (and unsets) the port lists. */
void ports_start(void);
int ports_named(void);        /* how many internal and HTTP/2 ports are named (0: accept() looks at none) */
int public_ports_named(void); /* how many HTTP/2 ports clients reach directly */
int own_port(int port);       /* only the server's own user may connect */
int h2_port(int port);        /* read as HTTP/2 */
int public_port(int port);    /* read as HTTP/2, clients reach it directly */

int local_port(int fd);
long peer_owner(int conn);
void say_refused(int port, long owner);

#pragma GCC visibility pop

#endif
