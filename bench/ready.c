// SPDX-License-Identifier: GPL-2.0
/*
 * A minimal sd_notify supervisor: starts a daemon, times it to READY=1, then
 * stays its parent until it exits.
 *
 *   ready NOTIFY_PATH REPORT_FILE CMD [ARGS…]
 *
 * Binds a Unix datagram socket at NOTIFY_PATH, starts CMD (a path) with
 * NOTIFY_SOCKET=NOTIFY_PATH in its environment, and waits (20 s at most) for
 * a datagram containing the line READY=1. Then it writes
 *     ready_ns=<fork to READY=1, CLOCK_MONOTONIC> pid=<daemon pid>
 * to REPORT_FILE (atomically: a temp file renamed into place), forwards
 * SIGTERM/SIGINT/SIGHUP to the daemon and waits for it; its exit status is
 * the daemon's (128+N if a signal killed it).
 * If the daemon exits or times out before READY=1, REPORT_FILE gets
 * `failed …` and the exit status is 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t child_pid;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void forward(int sig)
{
	if (child_pid > 0)
		kill(child_pid, sig);
	else
		_exit(128 + sig); /* no daemon yet: nothing to stop */
}

static int report(const char *file, const char *line)
{
	char tmp[4096];
	FILE *f;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", file) >= (int)sizeof(tmp))
		return -1;
	f = fopen(tmp, "w");
	if (!f)
		return -1;
	fputs(line, f);
	if (fclose(f) != 0)
		return -1;
	return rename(tmp, file);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s NOTIFY_PATH REPORT_FILE CMD [ARGS...]\n", argv[0]);
		return 2;
	}
	const char *npath = argv[1], *rfile = argv[2];
	char **cmd = argv + 3;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char line[256];

	if (strlen(npath) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "ready: socket path too long\n");
		return 2;
	}
	strcpy(sa.sun_path, npath);
	int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	unlink(npath);
	if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		fprintf(stderr, "ready: binding %s: %s\n", npath, strerror(errno));
		return 2;
	}
	if (setenv("NOTIFY_SOCKET", npath, 1) != 0)
		return 2;

	struct sigaction act = {.sa_handler = forward};
	sigemptyset(&act.sa_mask);
	sigaction(SIGTERM, &act, NULL);
	sigaction(SIGINT, &act, NULL);
	sigaction(SIGHUP, &act, NULL);

	/* No signal between the fork and child_pid being set. */
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	sigprocmask(SIG_BLOCK, &block, &old);
	uint64_t t0 = now_ns();
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		execv(cmd[0], cmd);
		fprintf(stderr, "ready: exec %s: %s\n", cmd[0], strerror(errno));
		_exit(127);
	}
	if (pid < 0) {
		fprintf(stderr, "ready: fork: %s\n", strerror(errno));
		return 2;
	}
	child_pid = pid;
	sigprocmask(SIG_SETMASK, &old, NULL);

	int st = 0, ready = 0, exited = 0;
	uint64_t deadline = t0 + 20000000000ull;
	while (!ready) {
		struct pollfd p = {.fd = s, .events = POLLIN};
		int r = poll(&p, 1, 5);
		if (r > 0) {
			char buf[4096];
			ssize_t len = recv(s, buf, sizeof(buf) - 1, 0);
			if (len > 0) {
				uint64_t t1 = now_ns();
				buf[len] = 0;
				/* sd_notify messages are newline-separated assignments. */
				for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
					if (strcmp(l, "READY=1") == 0) {
						snprintf(line, sizeof(line),
							 "ready_ns=%llu pid=%d\n",
							 (unsigned long long)(t1 - t0), (int)pid);
						ready = 1;
					}
			}
		}
		if (!ready && waitpid(pid, &st, WNOHANG) == pid) {
			exited = 1;
			break;
		}
		if (!ready && now_ns() > deadline)
			break;
	}
	close(s);
	unlink(npath);
	if (!ready) {
		if (!exited) {
			kill(pid, SIGTERM);
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
		}
		snprintf(line, sizeof(line), "failed %s\n",
			 exited ? "the daemon exited before READY=1" : "no READY=1 within 20 s");
		report(rfile, line);
		return 1;
	}
	if (report(rfile, line) != 0) {
		fprintf(stderr, "ready: writing %s: %s\n", rfile, strerror(errno));
		kill(pid, SIGTERM);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}
