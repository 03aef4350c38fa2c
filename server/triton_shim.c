/*
 * triton_shim: loaded into tritonserver with LD_PRELOAD, it does three things Triton 2.51 cannot be told to do.
 *
 * 1. The admin key stays out of /proc/<pid>/cmdline and the environment.
 *
 * Triton 2.51 takes its restricted-API keys only on the command line, and any local user can read a
 * process's command line. So the launcher passes a placeholder (@TRITON_ADMIN_KEY@) where the key
 * goes, and the key itself through an inherited file descriptor (a pipe, or `3<key_file` in a
 * container), whose number is in TRITON_SECRET_FD. This library, loaded with LD_PRELOAD, runs before
 * main(): it reads the key from that descriptor, closes it, and points each argv entry holding the
 * placeholder at a copy with the key filled in. main() parses the key; /proc/<pid>/cmdline still
 * shows the placeholder, because it reads the original argument strings, which are left as they were.
 * It then removes LD_PRELOAD and TRITON_SECRET_FD from the environment so that the processes the
 * server starts (Python-backend stubs) neither load it nor learn the descriptor.
 *
 *
 * 2. No code arrives through the model-control API. A load request may carry files ("file:1/model.py")
 * that Triton writes into a fresh temporary folder (mkdtemp, template .../folderXXXXXX) and loads: a
 * holder of the admin key could run any Python as the server's user. mkdtemp() below refuses that
 * template, so such a load fails ("failed to make temporary directory") while loads of the repository's
 * own models, with or without a config override, work as before.
 *
 * 3. Shared memory is private. The Python backend creates its regions (/dev/shm/triton_python_backend_*,
 * which carry every request's tensors) through boost.interprocess, which fchmod()s them to 0644 whatever
 * the umask. fchmod() below keeps only the owner's bits for files under /dev/shm, so other local users
 * cannot read them.
 *
 * Build: cc -shared -fPIC -O2 -o libtriton_shim.so triton_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PLACEHOLDER "@TRITON_ADMIN_KEY@"
#define MAX_SECRET 4096

static char *read_secret(int fd) {
    char *buffer = calloc(1, MAX_SECRET + 1);
    size_t used = 0;
    ssize_t got;
    if (buffer == NULL) return NULL;
    while (used < MAX_SECRET && (got = read(fd, buffer + used, MAX_SECRET - used)) > 0) used += (size_t)got;
    while (used > 0 && (buffer[used - 1] == '\n' || buffer[used - 1] == '\r' || buffer[used - 1] == ' ')) used--;
    buffer[used] = '\0';
    if (used == 0) {
        free(buffer);
        return NULL;
    }
    return buffer;
}

static char *fill_in(const char *arg, const char *secret) {
    size_t count = 0, token = strlen(PLACEHOLDER), keep = strlen(secret);
    for (const char *at = strstr(arg, PLACEHOLDER); at != NULL; at = strstr(at + token, PLACEHOLDER)) count++;
    char *out = malloc(strlen(arg) + count * keep + 1), *to = out;
    if (out == NULL) return NULL;
    for (const char *from = arg, *at; ; from = at + token) {
        at = strstr(from, PLACEHOLDER);
        size_t span = at ? (size_t)(at - from) : strlen(from);
        memcpy(to, from, span);
        to += span;
        if (at == NULL) break;
        memcpy(to, secret, keep);
        to += keep;
    }
    *to = '\0';
    return out;
}

__attribute__((constructor)) static void fill_in_secret(int argc, char **argv, char **envp) {
    (void)envp;
    const char *fd_text = getenv("TRITON_SECRET_FD");
    unsetenv("LD_PRELOAD");
    if (fd_text == NULL) return;
    int fd = atoi(fd_text);
    unsetenv("TRITON_SECRET_FD");
    char *secret = read_secret(fd);
    close(fd);
    if (secret == NULL) return; /* placeholders stay: the launcher's key check then fails the start */
    for (int i = 1; i < argc; i++) {
        if (strstr(argv[i], PLACEHOLDER) == NULL) continue;
        char *filled = fill_in(argv[i], secret);
        if (filled != NULL) argv[i] = filled;
    }
}

static int in_shared_memory(int fd) {
    char link[64], target[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length <= 0) return 0;
    target[length] = '\0';
    return strncmp(target, "/dev/shm/", 9) == 0;
}

int fchmod(int fd, mode_t mode) {
    static int (*real_fchmod)(int, mode_t) = NULL;
    if (real_fchmod == NULL) real_fchmod = (int (*)(int, mode_t))dlsym(RTLD_NEXT, "fchmod");
    if (in_shared_memory(fd)) mode &= S_IRWXU;
    return real_fchmod(fd, mode);
}

char *mkdtemp(char *template_path) {
    static char *(*real_mkdtemp)(char *) = NULL;
    if (real_mkdtemp == NULL) real_mkdtemp = (char *(*)(char *))dlsym(RTLD_NEXT, "mkdtemp");
    const char *base = strrchr(template_path, '/');
    if (base != NULL && strncmp(base + 1, "folder", 6) == 0) { /* Triton's folder for files sent with a load */
        errno = EACCES;
        return NULL;
    }
    return real_mkdtemp(template_path);
}
