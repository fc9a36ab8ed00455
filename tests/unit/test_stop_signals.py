"""A stop signal whose start-up interrupt was lost is still acted upon at the hand-over."""

from __future__ import annotations

import signal

from zephon_server.stop_signals import StopSignals


def test_a_signal_received_during_start_up_is_handed_over_at_once():
    # its StartupInterrupted was raised inside an import lock's weakref callback, where
    # Python only prints it: the server went on to serve and never stopped
    stop = StopSignals()
    stop.received = signal.SIGTERM
    called = []
    stop.hand_over(called.append)
    assert called == [signal.SIGTERM]


def test_without_a_signal_the_hand_over_calls_nothing():
    stop = StopSignals()
    called = []
    stop.hand_over(called.append)
    assert called == []
