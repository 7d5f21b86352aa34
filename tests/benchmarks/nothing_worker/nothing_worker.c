/* A worker that costs nothing but its own exec, for bench_docker_worker_floor (never deployed).

   It speaks as much of the codemode protocol as a trivial execute needs: every frame before the
   exec (the probe) is answered with probe_ack, the exec with final 1; then it exits 0. It reads
   frames whole (4-byte big-endian length, then the JSON) and looks only at their kind. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static unsigned char body[1 << 20];

static int read_all(unsigned char *to, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(0, to + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static void send_frame(const char *json) {
    uint32_t n = (uint32_t)strlen(json);
    unsigned char head[4] = {n >> 24, n >> 16, n >> 8, n};
    if (write(1, head, 4) != 4 || write(1, json, n) != (ssize_t)n) _exit(1);
}

int main(void) {
    for (;;) {
        unsigned char head[4];
        if (read_all(head, 4)) _exit(0); /* the host closed the stream */
        uint32_t n = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
        if (n >= sizeof body || read_all(body, n)) _exit(2);
        body[n] = 0;
        if (strstr((const char *)body, "\"k\":\"exec\"") || strstr((const char *)body, "\"k\": \"exec\"")) {
            send_frame("{\"k\":\"final\",\"value\":1}");
            _exit(0);
        }
        send_frame("{\"k\":\"probe_ack\",\"v\":1}");
    }
}
