/* own_ports: which ports the guard reads, and who may connect to the internal ones. TRITON_GUARD_OWN_PORTS lists the
 * ports (the HTTP and gRPC ports behind Envoy) that only processes of the server's own user may reach: the kernel
 * (sock_diag) says which user owns the connecting socket, and a connection of any other user is closed before
 * tritonserver reads a byte of it (its HTTP parser crashed on 2,000,000 one-byte chunks and on a body with a duplicated
 * key, and the edge's checks apply only to what passes through the edge). TRITON_GUARD_H2_PORTS are read as HTTP/2
 * (h2_reading.c), TRITON_GUARD_H2_PUBLIC of them are reached by clients directly. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>

#include "bounds.h"
#include "libc_calls.h"
#include "own_ports.h"

#define OWN_VARIABLE "TRITON_GUARD_OWN_PORTS"
#define H2_VARIABLE "TRITON_GUARD_H2_PORTS"
#define PUBLIC_VARIABLE "TRITON_GUARD_H2_PUBLIC"
#define MAX_PORTS 8

static int own_ports[MAX_PORTS], own_count = 0;
static int h2_ports[MAX_PORTS], h2_count = 0;
static int public_ports[MAX_PORTS], public_count = 0;
static unsigned long refusals = 0;

static int listed(int port, const int *ports, int count) {
    for (int i = 0; i < count; i++) {
        if (ports[i] == port) return 1;
    }
    return 0;
}

void ports_start(void) {
    own_count = front_port_list(OWN_VARIABLE, own_ports, MAX_PORTS);
    h2_count = front_port_list(H2_VARIABLE, h2_ports, MAX_PORTS);
    public_count = front_port_list(PUBLIC_VARIABLE, public_ports, MAX_PORTS);
}

int ports_named(void) { return own_count + h2_count; }
int public_ports_named(void) { return public_count; }
int own_port(int port) { return listed(port, own_ports, own_count); }
int h2_port(int port) { return listed(port, h2_ports, h2_count); }
int public_port(int port) { return listed(port, public_ports, public_count); }

int local_port(int fd) {
    struct sockaddr_storage address;
    socklen_t length = sizeof address;
    if (getsockname(fd, (struct sockaddr *)&address, &length) != 0) return -1;
    if (address.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&address)->sin_port);
    if (address.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&address)->sin6_port);
    return -1;
}

/* The owner of the TCP socket at the other end of conn, as the kernel knows it (sock_diag); -1 if unknown. */
static long tcp_peer_owner(int conn) {
    struct sockaddr_storage mine, theirs;
    socklen_t mine_length = sizeof mine, theirs_length = sizeof theirs;
    if (getsockname(conn, (struct sockaddr *)&mine, &mine_length) != 0) return -1;
    if (getpeername(conn, (struct sockaddr *)&theirs, &theirs_length) != 0) return -1;
    struct {
        struct nlmsghdr header;
        struct inet_diag_req_v2 request;
    } query;
    memset(&query, 0, sizeof query);
    query.header.nlmsg_len = sizeof query;
    query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    query.header.nlmsg_flags = NLM_F_REQUEST;
    query.request.sdiag_family = (uint8_t)theirs.ss_family;
    query.request.sdiag_protocol = IPPROTO_TCP;
    query.request.idiag_states = ~0U;
    query.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    query.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (theirs.ss_family == AF_INET) { /* the peer's socket: its source is their address, its destination ours */
        struct sockaddr_in *a = (struct sockaddr_in *)&theirs, *b = (struct sockaddr_in *)&mine;
        query.request.id.idiag_sport = a->sin_port;
        query.request.id.idiag_dport = b->sin_port;
        memcpy(query.request.id.idiag_src, &a->sin_addr, 4);
        memcpy(query.request.id.idiag_dst, &b->sin_addr, 4);
    } else if (theirs.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&theirs, *b = (struct sockaddr_in6 *)&mine;
        query.request.id.idiag_sport = a->sin6_port;
        query.request.id.idiag_dport = b->sin6_port;
        memcpy(query.request.id.idiag_src, &a->sin6_addr, 16);
        memcpy(query.request.id.idiag_dst, &b->sin6_addr, 16);
    } else {
        return -1;
    }
    int link = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (link < 0) return -1;
    long owner = -1;
    char answer[8192];
    if (real_send(link, &query, sizeof query, 0) == (ssize_t)sizeof query) {
        ssize_t got = real_recv(link, answer, sizeof answer, 0);
        struct nlmsghdr *header = (struct nlmsghdr *)answer;
        if (got >= (ssize_t)sizeof *header && NLMSG_OK(header, (size_t)got) && header->nlmsg_type == SOCK_DIAG_BY_FAMILY)
            owner = ((struct inet_diag_msg *)NLMSG_DATA(header))->idiag_uid;
    }
    real_close(link);
    return owner;
}

long peer_owner(int conn) {
    struct ucred credentials;
    socklen_t length = sizeof credentials;
    struct sockaddr_storage mine;
    socklen_t mine_length = sizeof mine;
    if (getsockname(conn, (struct sockaddr *)&mine, &mine_length) == 0 && mine.ss_family == AF_UNIX)
        return getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 ? (long)credentials.uid : -1;
    return tcp_peer_owner(conn);
}

void say_refused(int port, long owner) {
    refusals++;
    if (refusals <= 10 || refusals % 1000 == 0)
        guard_say("triton_guard: refused a connection to internal port %d from user %ld (only user %ld, the edge's, may "
            "connect; %lu refused so far)\n", port, owner, (long)geteuid(), refusals);
}
