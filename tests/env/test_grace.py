"""The preemption grace is one number: every default that speaks of it agrees (issue 20)."""

import inspect

from shoal.context import Context
from shoal.env.grace import EXIT_MARGIN_S, PLATFORM_GRACE_S, PREEMPT_GRACE_S
from shoal.jobs.kubernetes.options import grace_period
from shoal.preemption import PreemptionWatch
from shoal.train.config import TrainConfig


def test_every_default_grace_is_the_one_constant():
    assert TrainConfig().preempt_grace == PREEMPT_GRACE_S
    assert PreemptionWatch().grace_s == PREEMPT_GRACE_S
    assert inspect.signature(Context.preemption).parameters["grace_s"].default == PREEMPT_GRACE_S


def test_the_pods_grace_covers_the_checkpoint_and_the_exit_within_the_platforms_default():
    assert PREEMPT_GRACE_S + EXIT_MARGIN_S <= PLATFORM_GRACE_S
    assert grace_period(["shoal", "train", "digits"], None) == PREEMPT_GRACE_S + EXIT_MARGIN_S
    assert grace_period(["shoal", "train", "digits", "--preempt-grace", "40"], None) == 40 + EXIT_MARGIN_S
    assert grace_period(["python", "train.py"], None) == PLATFORM_GRACE_S
