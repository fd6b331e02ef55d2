/* The sandbox's stand-in for a VPC and a security group around Ray (ec2gpu/sandbox/bindshim.py).
 *
 * Loaded into a sandbox instance's Ray processes and its pool's driver (LD_PRELOAD, set by
 * ec2gpu/pool/node.py), it rewrites a bind() to the wildcard address (0.0.0.0; on an IPv6 socket ::
 * or the IPv4 wildcard as IPv6 sees it, ::ffff:0.0.0.0) into one to EC2GPU_SANDBOX_BIND, the
 * instance's own 127.0.0.N (::ffff:127.0.0.N on an IPv6 socket; ::1 on one that is IPv6-only), and
 * binds a stream socket that listen() is called on unbound (Linux would bind it to the wildcard
 * address) the same way first. Ray has no option for the address its gRPC servers bind
 * (gcs_server, raylet, the autoscaler's monitor, a driver's core worker: "0.0.0.0:PORT",
 * src/ray/rpc/grpc_server.cc), and the sandbox's instances are this machine, whose other
 * interfaces reach the user's network. A bind to any other address, and every bind and listen
 * without EC2GPU_SANDBOX_BIND, is passed on unchanged. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*listen_fn)(int, int);

/* The instance's own address (EC2GPU_SANDBOX_BIND) into *to: 1, or 0 when none is set. */
static int own_address(struct in_addr *to) {
    const char *ip = getenv("EC2GPU_SANDBOX_BIND");
    return ip && inet_pton(AF_INET, ip, to) == 1;
}

/* Whether an IPv6 address is a wildcard: ::, or ::ffff:0.0.0.0 (every IPv4 address of a
 * dual-stack socket). */
static int wildcard6(const struct in6_addr *a) {
    static const unsigned char v4_any[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
    return IN6_IS_ADDR_UNSPECIFIED(a) || memcmp(a->s6_addr, v4_any, sizeof v4_any) == 0;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real = 0;
    if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    struct in_addr to;
    if (!addr || !own_address(&to)) return real(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr = to;
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (wildcard6(&a.sin6_addr)) {
            int only = 0;
            socklen_t size = sizeof only;
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, &size) == 0 && only) {
                a.sin6_addr = in6addr_loopback; /* no IPv4 on this socket: loopback, not every address */
            } else {
                a.sin6_addr.s6_addr[10] = 0xff; /* ::ffff:127.0.0.N, the IPv4 address as IPv6 sees it */
                a.sin6_addr.s6_addr[11] = 0xff;
                memcpy(&a.sin6_addr.s6_addr[12], &to, 4);
            }
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real(fd, addr, len);
}

int listen(int fd, int backlog) {
    static listen_fn real = 0;
    if (!real) real = (listen_fn)dlsym(RTLD_NEXT, "listen");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    struct in_addr to;
    struct sockaddr_storage a;
    socklen_t size = sizeof a;
    int type = 0;
    socklen_t type_size = sizeof type;
    if (own_address(&to) && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_size) == 0 && type == SOCK_STREAM
        && getsockname(fd, (struct sockaddr *)&a, &size) == 0) {
        /* a stream socket's port is 0 until it is bound; its address is then the wildcard, which
         * bind() above makes the instance's own */
        int unbound = (a.ss_family == AF_INET && ((struct sockaddr_in *)&a)->sin_port == 0)
                      || (a.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&a)->sin6_port == 0);
        if (unbound && bind(fd, (const struct sockaddr *)&a, size) != 0) return -1;
    }
    return real(fd, backlog);
}
