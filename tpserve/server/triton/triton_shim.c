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
 * 4. A stub runs only a model file of the repository. Triton 2.51's Python backend starts each stub as
 * `bash -c " exec <stub> <model_path> <arguments>"`, where model_path is <model folder>/<version>/ followed by
 * the config's default_model_filename, which a load's config override sets: a key holder could point it
 * anywhere ("../../../x/model.py") or put shell in it. execvp() below lets bash start only that exact
 * command, every word of it made of plain path characters, with model_path equal to
 * <repository>/<model>/<version>/<file>, no component empty, "." or "..", for a repository tritonserver was
 * started with (--model-repository). system() below holds the backend's stub probe to the same characters
 * and to paths without "..". Execution environments (EXECUTION_ENV_PATH, a "source ..." command) are refused.
 * A refused stub is not left unstarted, nor started on a missing file: 2.51's backend then waits forever and
 * the model's load never ends. The backend's own stub starts instead, without a shell, on a small model
 * beside this library (refused/outside or refused/missing) whose initialize() raises why, so the load
 * fails at once with that message and nothing of the request runs.
 *
 * 5. It runs only in the tritonserver it was tested with. Everything above leans on how 2.51 parses its command
 * line, names its temporary folders and starts its stubs; another release may do any of it differently, and a
 * shim that silently does nothing would leave the key on the command line or the stubs unchecked. Before main()
 * it asks libtritonserver for its server API version (TRITONSERVER_ApiVersion) and stops the process, saying
 * which version it found and which it was tested with, unless that version is one of TESTED_API, or the one
 * TRITON_SHIM_ACCEPT_API names (an operator's explicit "I checked this release": the exact major.minor, so a
 * later upgrade is refused again). A process without libtritonserver (a test program) is not checked.
 *
 * Build: cc -shared -fPIC -O2 -o libtriton_shim.so triton_shim.c front/[a-z]*.c -ldl -lpthread -lm
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PLACEHOLDER "@TRITON_ADMIN_KEY@"
#ifndef TESTED_API
#define TESTED_API "1.34" /* tritonserver 2.51 (the nvidia-pytriton 0.7.0 wheel); space-separated major.minor */
#endif
#define TESTED_RELEASES "tritonserver 2.51"
#define ACCEPT_VARIABLE "TRITON_SHIM_ACCEPT_API"
#define MAX_REPOSITORIES 16
#define STUB_NAME "triton_python_backend_stub"

#define REFUSED_MODEL "/refused_by_triton_shim/0/model_file_outside_its_version_folder_or_not_plainly_named"
#define REFUSAL_MODELS "refused" /* beside this library: refused/{outside,missing}/0/model.py (secret_args.py) */
#define REGION_WORD " triton_python_backend_shm_region_"
#define MAX_WORDS 16

static char *repositories[MAX_REPOSITORIES];
static int repository_count = 0;
static char *backend_directory = NULL;
static char shim_folder[4096] = "";
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

static void remember_repositories(int argc, char **argv) {
    const char *flag = "--model-repository";
    size_t length = strlen(flag);
    for (int i = 1; i < argc && repository_count < MAX_REPOSITORIES; i++) {
        const char *value = NULL;
        if (strncmp(argv[i], "--backend-directory=", 20) == 0) backend_directory = strdup(argv[i] + 20);
        if (strncmp(argv[i], flag, length) == 0 && argv[i][length] == '=') value = argv[i] + length + 1;
        else if (strcmp(argv[i], flag) == 0 && i + 1 < argc) value = argv[++i];
        if (value == NULL || value[0] != '/') continue;
        char *copy = strdup(value);
        size_t end = strlen(copy);
        while (end > 1 && copy[end - 1] == '/') copy[--end] = '\0';
        repositories[repository_count++] = copy;
    }
}

static void remember_shim_folder(void) {
    Dl_info info;
    if (dladdr((void *)remember_shim_folder, &info) == 0 || info.dli_fname == NULL) return;
    snprintf(shim_folder, sizeof shim_folder, "%s", info.dli_fname);
    char *slash = strrchr(shim_folder, '/');
    if (slash != NULL) *slash = '\0';
    else shim_folder[0] = '\0';
}

static int listed(const char *list, const char *word) {
    size_t length = strlen(word);
    for (const char *at = list; (at = strstr(at, word)) != NULL; at += length) {
        int starts = at == list || at[-1] == ' ';
        int ends = at[length] == '\0' || at[length] == ' ';
        if (starts && ends) return 1;
    }
    return 0;
}

static void check_server_version(void) {
    typedef void *(*api_version_fn)(uint32_t *, uint32_t *);
    api_version_fn api_version = (api_version_fn)dlsym(RTLD_DEFAULT, "TRITONSERVER_ApiVersion");
    if (api_version == NULL) return; /* not tritonserver */
    uint32_t major = 0, minor = 0;
    api_version(&major, &minor);
    char found[32];
    snprintf(found, sizeof found, "%u.%u", major, minor);
    if (listed(TESTED_API, found)) return;
    const char *accepted = getenv(ACCEPT_VARIABLE);
    if (accepted != NULL && strcmp(accepted, found) == 0) {
        fprintf(stderr, "triton_shim: running in a tritonserver of server API %s, accepted by %s=%s; tested with "
                "%s (server API %s)\n", found, ACCEPT_VARIABLE, accepted, TESTED_RELEASES, TESTED_API);
        return;
    }
    fprintf(stderr, "triton_shim: refusing to run in this tritonserver: its server API is %s, and the shim was tested "
            "with %s (server API %s). The key filling, model-file and shared-memory checks lean on that release's "
            "behaviour. Serve with %s, or, once you have checked this release, set %s=%s\n",
            found, TESTED_RELEASES, TESTED_API, TESTED_RELEASES, ACCEPT_VARIABLE, found);
    _exit(78); /* EX_CONFIG */
}

__attribute__((constructor)) static void fill_in_secret(int argc, char **argv, char **envp) {
    (void)envp;
    check_server_version();
    remember_repositories(argc, argv);
    remember_shim_folder();
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

static int plain_word(const char *text, size_t length) {
    for (size_t i = 0; i < length; i++) {
        char c = text[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("_./:=+-", c);
        if (!ok || c == '\0') return 0;
    }
    return 1;
}

static int has_dot_component(const char *path, size_t length) {
    for (size_t i = 0; i < length; i++) {
        if (i > 0 && path[i - 1] != '/') continue;
        size_t end = i;
        while (end < length && path[end] != '/') end++;
        if (end == i || (end - i == 1 && path[i] == '.') || (end - i == 2 && path[i] == '.' && path[i + 1] == '.')) {
            if (!(i == 0 && end == 0)) return 1; /* an empty, "." or ".." component (the leading '/' aside) */
        }
    }
    return 0;
}

/* <repository>/<model>/<version>/<file> for a repository of this server, every component a plain name */
static int model_file_allowed(const char *path, size_t length) {
    if (has_dot_component(path, length)) return 0;
    for (int r = 0; r < repository_count; r++) {
        size_t root = strlen(repositories[r]);
        if (length <= root + 1 || strncmp(path, repositories[r], root) != 0 || path[root] != '/') continue;
        int slashes = 0;
        for (size_t i = root + 1; i < length; i++) slashes += path[i] == '/';
        if (slashes == 2) return 1;
    }
    return 0;
}

/* the model path of " exec <stub> <model_path> ..." (a copy), or NULL */
static char *model_path_of(const char *command) {
    const char *stub = command + 6, *model = strchr(stub, ' ');
    if (strncmp(command, " exec ", 6) != 0 || model == NULL) return NULL;
    const char *end = strchr(model + 1, ' ');
    return strndup(model + 1, end ? (size_t)(end - model - 1) : strlen(model + 1));
}

/* " exec <stub> <model_path> ...": 1 when bash may run it */
static int stub_command_allowed(const char *command) {
    const char *prefix = " exec ";
    size_t total = strlen(command);
    if (strncmp(command, prefix, strlen(prefix)) != 0) return 0;
    for (size_t i = 0; i < total; i++) {
        if (command[i] != ' ' && !plain_word(command + i, 1)) return 0;
    }
    const char *stub = command + strlen(prefix);
    const char *stub_end = strchr(stub, ' ');
    if (stub_end == NULL || has_dot_component(stub, (size_t)(stub_end - stub))) return 0;
    const char *model = stub_end + 1;
    const char *model_end = strchr(model, ' ');
    size_t length = model_end ? (size_t)(model_end - model) : strlen(model);
    if (total < 8 || strcmp(command + total - 8, " DEFAULT") != 0) return 0; /* a backend runtime's model.py */
    return model_file_allowed(model, length);
}

/* The backend's own stub, no shell, the Triton-made words of command after the model path, and a model
 * path that does not exist: the stub reports "Python model file not found" and the load fails at once. */
static int start_refused_stub(const char *command, const char *reason, int (*real_execv)(const char *, char *const[])) {
    const char *region = strstr(command, REGION_WORD);
    if (region == NULL || backend_directory == NULL) return -1;
    char stub[4096], refusal[4200];
    snprintf(stub, sizeof stub, "%s/python/%s", backend_directory, STUB_NAME);
    snprintf(refusal, sizeof refusal, "%s/%s/%s/0/model.py", shim_folder, REFUSAL_MODELS, reason);
    char *words = strdup(region + 1), *argv[MAX_WORDS + 3];
    int count = 0;
    argv[count++] = stub;
    argv[count++] = (shim_folder[0] && access(refusal, R_OK) == 0) ? refusal : REFUSED_MODEL;
    for (char *save = NULL, *word = strtok_r(words, " ", &save); word && count < MAX_WORDS; word = strtok_r(NULL, " ", &save))
        argv[count++] = word;
    if (count > 10) { /* a stub name with spaces: joined again, the last word is the runtime folder */
        char *last = argv[count - 1];
        for (int i = 9; i < count - 1; i++) argv[i][-1] = ' ';
        argv[9] = last;
        count = 10;
    }
    argv[count] = NULL;
    return real_execv(stub, argv);
}

static void say_refused(const char *what, const char *command) {
    fprintf(stderr, "triton_shim: refused to run %s: '%.300s' (a model file must lie in its model's version "
            "folder of the repository, named with plain characters; execution environments are not allowed)\n",
            what, command);
}

int execvp(const char *file, char *const argv[]) {
    static int (*real_execvp)(const char *, char *const[]) = NULL;
    if (real_execvp == NULL) real_execvp = (int (*)(const char *, char *const[]))dlsym(RTLD_NEXT, "execvp");
    if (strcmp(file, "bash") == 0 && argv[0] && argv[1] && strcmp(argv[1], "-c") == 0 && argv[2]) {
        if (strstr(argv[2], STUB_NAME) != NULL || strstr(argv[2], "source ") != NULL) {
            const char *reason = NULL;
            if (argv[3] != NULL || !stub_command_allowed(argv[2])) {
                say_refused("a Python-backend stub", argv[2]);
                reason = "outside";
            } else {
                char *model = model_path_of(argv[2]);
                if (model != NULL && access(model, R_OK) != 0) reason = "missing";
                free(model);
            }
            if (reason != NULL) {
                int (*real_execv)(const char *, char *const[]) = (int (*)(const char *, char *const[]))dlsym(RTLD_NEXT, "execv");
                start_refused_stub(argv[2], reason, real_execv);
                errno = EACCES;
                return -1;
            }
        }
    }
    return real_execvp(file, argv);
}

int system(const char *command) {
    static int (*real_system)(const char *) = NULL;
    if (real_system == NULL) real_system = (int (*)(const char *))dlsym(RTLD_NEXT, "system");
    const char *suffix = "> /dev/null 2>&1";
    if (command != NULL && strstr(command, STUB_NAME) != NULL) {
        size_t total = strlen(command), tail = strlen(suffix);
        if (total <= tail || strcmp(command + total - tail, suffix) != 0 || !plain_word(command, total - tail) ||
            has_dot_component(command, total - tail)) {
            say_refused("a stub probe", command);
            return -1;
        }
    }
    return real_system(command);
}
