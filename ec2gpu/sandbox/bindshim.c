/* The sandbox's stand-in for a VPC and a security group around Ray (ec2gpu/sandbox/bindshim.py).
 *
 * Loaded into a sandbox instance's Ray processes (LD_PRELOAD, set by ec2gpu/pool/node.py), it
 * rewrites a bind() to the wildcard address (0.0.0.0, or :: for a dual-stack IPv6 socket) into one
 * to EC2GPU_SANDBOX_BIND, the instance's own 127.0.0.N (::ffff:127.0.0.N on an IPv6 socket; ::1 on
 * one that is IPv6-only). Ray has no option for the address its gRPC servers bind (gcs_server,
 * raylet, the autoscaler's monitor: "0.0.0.0:PORT", src/ray/rpc/grpc_server.cc), and the sandbox's
 * instances are this machine, whose other interfaces reach the user's network. A bind to any
 * other address, and every bind without EC2GPU_SANDBOX_BIND, is passed on unchanged. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real = 0;
    if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    const char *ip = getenv("EC2GPU_SANDBOX_BIND");
    struct in_addr to;
    if (!ip || !addr || inet_pton(AF_INET, ip, &to) != 1) return real(fd, addr, len);
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
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
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
