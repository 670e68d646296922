"""A point's deadline: the startup allowance, the projection from its warm-up, a configured limit."""

from sweeper.worker.deadline import FLOOR_SECONDS, PROJECTION_FACTOR, STARTUP_ALLOWANCE_SECONDS, Deadline


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def watched(configured=None):
    clock, expired = Clock(), []
    return Deadline(configured, clock=clock, on_expiry=expired.append), clock, expired


def test_a_point_past_its_projected_deadline_is_ended_and_one_within_it_is_not():
    deadline, clock, expired = watched()
    deadline._set("mb8-acc1-w1", STARTUP_ALLOWANCE_SECONDS)  # armed without starting the thread
    clock.now += 100.0  # warm-up: 4 of 104 steps in 100 s, so the rest takes 2500 s at that pace
    deadline.project(done_steps=4, total_steps=104, elapsed_seconds=100.0)
    armed_at = 1000.0
    clock.now = armed_at + 100.0 + PROJECTION_FACTOR * 2500.0 - 1.0  # the limit counts from the point's start
    assert not deadline.check() and expired == []
    clock.now += 2.0
    assert deadline.check()
    assert expired == [f"point mb8-acc1-w1 passed its deadline of {100 + PROJECTION_FACTOR * 2500:.0f} s"]


def test_the_projection_never_goes_below_the_floor_and_a_disarmed_point_never_expires():
    deadline, clock, expired = watched()
    deadline._set("fast", STARTUP_ALLOWANCE_SECONDS)
    deadline.project(done_steps=10, total_steps=11, elapsed_seconds=1.0)
    clock.now += FLOOR_SECONDS
    assert not deadline.check()
    deadline.disarm()
    clock.now += 10 * STARTUP_ALLOWANCE_SECONDS
    assert not deadline.check() and expired == []


def test_a_configured_deadline_is_kept_whatever_the_warm_up_says():
    deadline, clock, expired = watched(configured=30.0)
    deadline._set("slow", deadline.configured)
    deadline.project(done_steps=1, total_steps=1000, elapsed_seconds=10.0)
    clock.now += 31.0
    assert deadline.check() and expired == ["point slow passed its deadline of 30 s"]
