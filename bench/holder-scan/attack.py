#!/usr/bin/env python3
# attack.py SOCK UID SECONDS: 8 connections of UID ask `who` without pause; prints root's worst `get` latency (ms).
import os, socket, sys, time, threading
sock, uid, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rwb")
        end = time.time() + secs
        while time.time() < end:
            f.write(b'{"type":"who"}\n'); f.flush(); f.readline()
        os._exit(0)
    kids.append(pid)
time.sleep(0.3)
s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rwb")
worst = 0.0; end = time.time() + secs - 0.5
while time.time() < end:
    t0 = time.time(); f.write(b'{"type":"get"}\n'); f.flush(); f.readline()
    worst = max(worst, time.time() - t0); time.sleep(0.05)
for k in kids: os.waitpid(k, 0)
print(int(worst * 1000))
