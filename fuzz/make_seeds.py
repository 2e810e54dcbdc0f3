#!/usr/bin/env python3
"""Turns a capture of server bytes (walgate stream --capture FILE) into seed corpora:
   backend_frame/  the whole capture, and each message on its own
   copy_payload/   the payload of each CopyData message ('w' and 'k')
usage: make_seeds.py CAPTURE CORPUS_DIR"""
import hashlib, os, struct, sys

data = open(sys.argv[1], 'rb').read()
out = sys.argv[2]

def save(kind, blob):
    d = os.path.join(out, kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(blob).hexdigest()[:16]), 'wb') as f:
        f.write(blob)

# The capture starts with the answer to SSLRequest when TLS was negotiated ('N' or 'S'): skip it.
pos = 0
if data[:1] in (b'N',) and len(data) > 5 and data[1:2] == b'R':
    pos = 1
save('backend_frame', data[pos:])
while pos + 5 <= len(data):
    tag = data[pos:pos + 1]
    (length,) = struct.unpack('>I', data[pos + 1:pos + 5])
    msg = data[pos:pos + 1 + length]
    save('backend_frame', msg)
    if tag == b'd':
        save('copy_payload', msg[5:])
    pos += 1 + length
