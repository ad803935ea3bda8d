/* vmopen: report whether paths can be opened, for the tier-3 guest tests.
 *
 *   vmopen PATH [PATH...]        open(PATH, O_RDONLY | O_NONBLOCK | O_CLOEXEC), then close
 *   vmopen --stat PATH [PATH...] stat(PATH) instead
 *   vmopen --statx PATH [PATH...]  statx(AT_FDCWD, PATH, 0, STATX_BASIC_STATS)
 *   vmopen --access PATH [PATH...] access(PATH, F_OK) (what GLib's g_file_test and so
 *                                  Flatpak use to decide which /dev nodes to bind)
 *   vmopen --faccessat2 PATH...    faccessat2(AT_FDCWD, PATH, F_OK, AT_EACCESS)
 *   vmopen --when-made PATH...     wait (stat in a loop, at most 20 s) until PATH exists,
 *                                  then open it at once: the first open a racing program
 *                                  can make of a node a driver is creating
 *
 * Prints one line per path: "PATH ok", or "PATH ENOENT" / "EPERM" / "ENXIO" / "EACCES" /
 * "ENODEV" / "E<errno>" (a number when the name is not in the short list below). Never
 * reads: a read on a DRM fd blocks. Exit status: 0 if every path was ok, 1 if any failed,
 * 2 on bad usage.
 *
 * Built by tests/vm/guest-tests.sh with `gcc -static -O2` and added to the guest as
 * /bin/vmopen.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_faccessat2
#define SYS_faccessat2 439
#endif

static const char *errname(int e)
{
	static char buf[32];

	switch (e) {
	case ENOENT:
		return "ENOENT";
	case EPERM:
		return "EPERM";
	case EACCES:
		return "EACCES";
	case ENXIO:
		return "ENXIO";
	case ENODEV:
		return "ENODEV";
	case EBUSY:
		return "EBUSY";
	case EINVAL:
		return "EINVAL";
	case EIO:
		return "EIO";
	case ENOTDIR:
		return "ENOTDIR";
	case EFAULT:
		return "EFAULT";
	}
	snprintf(buf, sizeof(buf), "E%d", e);
	return buf;
}

enum how { OPEN, STAT, STATX, ACCESS, FACCESSAT2, WHEN_MADE };

static int try_path(enum how how, const char *path)
{
	struct stat st;
	struct statx stx;
	int fd;

	switch (how) {
	case STAT:
		return stat(path, &st) ? errno : 0;
	case STATX:
		return statx(AT_FDCWD, path, 0, STATX_BASIC_STATS, &stx) ? errno : 0;
	case ACCESS:
		return access(path, F_OK) ? errno : 0;
	case FACCESSAT2:
		return syscall(SYS_faccessat2, AT_FDCWD, path, F_OK, AT_EACCESS) ? errno : 0;
	case WHEN_MADE: {
		struct timespec t0, t;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		while (stat(path, &st)) {
			if (errno != ENOENT)
				return errno;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec > 20)
				return ENOENT;
		}
		break;
	}
	case OPEN:
		break;
	}
	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return errno;
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *flag;
		enum how how;
	} flags[] = {
	    {"--stat", STAT},		{"--statx", STATX},
	    {"--access", ACCESS},	{"--faccessat2", FACCESSAT2},
	    {"--when-made", WHEN_MADE},
	};
	enum how how = OPEN;
	int failed = 0, i = 1;
	unsigned int f;

	for (f = 0; i < argc && f < sizeof(flags) / sizeof(flags[0]); f++) {
		if (strcmp(argv[i], flags[f].flag) == 0) {
			how = flags[f].how;
			i++;
			break;
		}
	}
	if (i >= argc) {
		fprintf(stderr, "usage: vmopen [--stat|--statx|--access|--faccessat2|--when-made] "
				"PATH [PATH...]\n");
		return 2;
	}
	for (; i < argc; i++) {
		int err = try_path(how, argv[i]);

		printf("%s %s\n", argv[i], err ? errname(err) : "ok");
		if (err)
			failed = 1;
	}
	return failed;
}
