"""Rejoin commands as a surviving rank's loop sees them: the newest attempt wins, an old
attempt's command is ignored with a log line."""

from __future__ import annotations

import logging
import threading

import pytest

from goodput import schemas
from goodput.shim.inprocess import RejoinMailbox
from goodput.shim.trainer import ShimConfig, TrainerShim


def _rejoin(attempt: int) -> schemas.Rejoin:
    return schemas.Rejoin(
        job="j", attempt=attempt, master_addr="127.0.0.1", master_port=29500, world_size=2
    )


def test_a_rejoin_for_an_attempt_already_reached_is_ignored_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mailbox = RejoinMailbox(attempt=3)
    with caplog.at_level(logging.WARNING):
        assert not mailbox.offer(_rejoin(3)) and not mailbox.offer(_rejoin(2))
    assert "ignoring Rejoin for attempt 2: this rank is at attempt 3" in caplog.text
    assert not mailbox.pending and mailbox.wait(0) is None


def test_the_newest_attempt_wins_and_taking_it_moves_the_rank_on() -> None:
    mailbox = RejoinMailbox(attempt=1)
    assert mailbox.offer(_rejoin(3)) and not mailbox.offer(_rejoin(2))
    command = mailbox.wait(0)
    assert command is not None and command.attempt == 3 and mailbox.attempt == 3
    assert not mailbox.offer(_rejoin(3))


def test_a_waiting_loop_wakes_when_the_rejoin_arrives() -> None:
    mailbox = RejoinMailbox(attempt=1)
    threading.Timer(0.05, mailbox.offer, args=(_rejoin(2),)).start()
    command = mailbox.wait(30)
    assert command is not None and command.attempt == 2


def test_a_rank_started_into_an_attempt_ignores_its_rejoin(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    # a standby assigned while the survivors are told to rejoin sees that Rejoin too: it must
    # not answer "cannot" (its loop is not running yet), which would fail the warm restart
    shim = TrainerShim(ShimConfig(attempt=3, ckpt_dir=str(tmp_path)), install_signal_handlers=False)
    answers: list[bool] = []
    shim.answer_rejoin = lambda command, ok, **_: answers.append(ok)  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        shim._on_command(_rejoin(3))
    assert (
        answers == [] and "ignoring Rejoin for attempt 3: this rank is at attempt 3" in caplog.text
    )
    shim._on_command(_rejoin(4))  # a newer attempt: this loop cannot restart in process
    assert answers == [False]
    shim.engine.close()
