#!/usr/bin/env python3
"""uds-forward.py ADDRESS PORT SOCKET: forwards each TCP connection to
ADDRESS:PORT to the UNIX socket SOCKET.

Run inside a guest host, it lets a test on the machine outside call the
node's CSI socket in the guest, as kubelet calls it from inside a real host.
Only the guest's private link (a tap to this machine, hack/harness/src/guest)
reaches ADDRESS; nothing in the product listens on TCP for CSI.
"""
import socket
import sys
import threading


def pipe(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    address, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    server = socket.create_server((address, port))
    while True:
        caller, _ = server.accept()
        node = socket.socket(socket.AF_UNIX)
        try:
            node.connect(path)
        except OSError:
            caller.close()
            node.close()
            continue
        for source, sink in ((caller, node), (node, caller)):
            threading.Thread(target=pipe, args=(source, sink), daemon=True).start()


main()
