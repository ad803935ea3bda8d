// SPDX-License-Identifier: GPL-2.0
/*
 * The least a client of the daemon can do: the limit `gpuctl get` is
 * measured against.
 *
 *   client SOCKET LINE
 *
 * Connects to the daemon's socket, sends LINE and a newline (the request
 * `gpuctl get` sends: {"type":"get","proto":1}), reads the response line
 * and writes it to stdout. Exit status 0 when the response says "ok":true,
 * 1 otherwise, 2 on bad usage. Built like gpuctl (static PIE), so the two
 * differ only in what each does after exec.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s SOCKET LINE\n", argv[0]);
		return 2;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (strlen(argv[1]) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "client: socket path too long\n");
		return 2;
	}
	strcpy(sa.sun_path, argv[1]);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		perror("client: connect");
		return 1;
	}
	char req[4096];
	int n = snprintf(req, sizeof(req), "%s\n", argv[2]);

	if (n < 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n) {
		perror("client: write");
		return 1;
	}
	static char buf[1 << 16];
	size_t got = 0;

	while (got < sizeof(buf) - 1) {
		ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);

		if (r <= 0)
			break;
		got += (size_t)r;
		if (memchr(buf + got - (size_t)r, '\n', (size_t)r))
			break;
	}
	buf[got] = 0;
	fwrite(buf, 1, got, stdout);
	return strstr(buf, "\"ok\":true") ? 0 : 1;
}
