// SPDX-License-Identifier: GPL-2.0
/*
 * The needed-only loader (issue 21): what gpuctl's start to READY=1 is
 * measured against. It does only what a start cannot skip: load and verify
 * the programs the saved mode attaches, attach them, say READY=1.
 *
 *   minload OBJECT MAX_GRANTS CGROUP_DIR|- ATTACH|- PROG...
 *
 * Opens OBJECT (bpf/gpuctl.bpf.c compiled as build.rs compiles it) with
 * libbpf (the bench links the libbpf build of the static gpuctl), sizes the
 * `grants` map to MAX_GRANTS as the daemon does (a hash map is allocated
 * at load), marks only the PROGs named for loading, loads, attaches the
 * program ATTACH (a cgroup/dev program to CGROUP_DIR, an lsm program to
 * its hook; `-`: none), sends READY=1 to $NOTIFY_SOCKET and waits for
 * SIGTERM or SIGINT. Exit status 0, or 1 with the failed step on stderr.
 */
#define _GNU_SOURCE
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int fail(const char *what, int err)
{
	fprintf(stderr, "minload: %s: %s\n", what, strerror(err < 0 ? -err : err));
	return 1;
}

static int notify_ready(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	static const char msg[] = "READY=1";
	size_t len;
	int fd, r;

	if (!path || !*path)
		return 0;
	len = strlen(path);
	if (len >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, len);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = 0;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	r = (int)sendto(fd, msg, sizeof(msg) - 1, 0, (struct sockaddr *)&sa,
			(socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
	r = r < 0 ? -errno : 0;
	close(fd);
	return r;
}

int main(int argc, char **argv)
{
	struct bpf_program *prog, *attach = NULL;
	struct bpf_link *link = NULL;
	struct bpf_object *obj;
	struct bpf_map *grants;
	sigset_t sigs;
	int err, sig, i;

	if (argc < 6) {
		fprintf(stderr, "usage: %s OBJECT MAX_GRANTS CGROUP_DIR|- ATTACH|- PROG...\n",
			argv[0]);
		return 2;
	}
	/* Blocked now, so a SIGTERM before the wait is not lost. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigprocmask(SIG_BLOCK, &sigs, NULL);

	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj)
		return fail("opening the object", errno);
	grants = bpf_object__find_map_by_name(obj, "grants");
	if (!grants)
		return fail("finding the grants map", ENOENT);
	err = bpf_map__set_max_entries(grants, (__u32)strtoul(argv[2], NULL, 10));
	if (err)
		return fail("sizing the grants map", err);
	bpf_object__for_each_program(prog, obj)
	{
		bool want = false;

		for (i = 5; i < argc; i++)
			want |= strcmp(bpf_program__name(prog), argv[i]) == 0;
		bpf_program__set_autoload(prog, want);
		if (strcmp(bpf_program__name(prog), argv[4]) == 0)
			attach = prog;
	}
	err = bpf_object__load(obj);
	if (err)
		return fail("loading", err);
	if (attach && strcmp(argv[3], "-") != 0) {
		int cg = open(argv[3], O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (cg < 0)
			return fail("opening the cgroup", errno);
		link = bpf_program__attach_cgroup(attach, cg);
		close(cg);
	} else if (attach) {
		link = bpf_program__attach(attach);
	}
	if (attach && !link)
		return fail("attaching", errno);
	err = notify_ready();
	if (err)
		return fail("sending READY=1", err);
	sigwait(&sigs, &sig);
	bpf_link__destroy(link);
	bpf_object__close(obj);
	return 0;
}
