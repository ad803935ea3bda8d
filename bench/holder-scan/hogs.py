#!/usr/bin/env python3
# hogs.py NPROC NFDS UID: NPROC processes, each NFDS O_PATH fds of /dev/null, then sleep.
import os, sys, resource, time
n, fds, uid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
pids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
        for _ in range(fds):
            os.open("/dev/null", os.O_PATH)
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        time.sleep(3600)
        os._exit(0)
    pids.append(pid)
print(" ".join(map(str, pids)), flush=True)
time.sleep(3600)
