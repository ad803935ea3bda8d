#!/usr/bin/env python3
import socket, sys, time, json
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
def who():
    f.write(b'{"type":"who"}\n'); f.flush(); return json.loads(f.readline())
who(); out = []
for _ in range(3):
    time.sleep(0.4)
    t0 = time.time(); a0 = who()["data"]["age_ms"]
    while True:
        a = who()["data"]["age_ms"]
        if a < a0: break
        a0 = a; time.sleep(0.002)
    out.append(int((time.time() - t0) * 1000) - a)
print(" ".join(map(str, out)))
