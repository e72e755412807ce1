"""A group's connections are the TCP connections its creation opened, the bus's spared (the
shim's link connects while a rendezvous waits); cutting them ends reads on both sides, and
leaves listeners and every other connection alone."""

from __future__ import annotations

import os
import socket

from goodput.shim.group_sockets import cut, opened_by


def _inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def test_the_connections_a_creation_opened_are_found_but_the_buss_are_spared() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as bus,
        socket.create_server(("127.0.0.1", 0)) as peer_listener,
        socket.create_connection(peer_listener.getsockname()) as older,
    ):
        opened: list[socket.socket] = []

        def create() -> str:
            opened.append(socket.create_connection(bus.getsockname()))
            opened.append(socket.create_connection(peer_listener.getsockname()))
            opened.append(socket.create_server(("127.0.0.1", 0)))  # gloo's own listener
            return "group"

        group, found = opened_by(create, sparing=frozenset({bus.getsockname()[1]}))
        to_bus, to_peer, listener = opened
        try:
            assert group == "group"
            assert found == {_inode(to_peer), _inode(listener)}
            accepted = [peer_listener.accept()[0] for _ in range(2)]  # older's and to_peer's
            (peer_side,) = [a for a in accepted if a.getpeername() == to_peer.getsockname()]
            with accepted[0], accepted[1]:
                assert cut(found) == 1  # the listener is never shut down
                assert peer_side.recv(1) == b""  # the peer sees this side gone
                assert to_peer.recv(1) == b""
                older.sendall(b"x")  # connections opened before it are untouched
                to_bus.sendall(b"x")
                assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        finally:
            for sock in opened:
                sock.close()


def test_a_cut_never_touches_a_descriptor_number_reused_by_another_socket() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        first = socket.create_connection(server.getsockname())
        gone = frozenset({_inode(first)})
        first.close()
        with socket.create_connection(server.getsockname()) as second:
            assert cut(gone) == 0
            second.sendall(b"x")
