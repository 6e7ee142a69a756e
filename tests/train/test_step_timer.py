"""The training pass's clock (shoal.train.step.StepTimer) writing a real progress record: what a step
counts as compute and as wait, its samples over micro-batches, and the epoch's seconds in the tally."""

import signal
import time

import torch

from shoal.preemption import PreemptionWatch
from shoal.progress import ProgressWriter, read_progress
from shoal.train.step import EpochTally, StepTimer

WAIT_S, COMPUTE_S = 0.03, 0.05


def test_a_step_of_two_micro_batches_is_timed_and_counted(tmp_path):
    progress = ProgressWriter(tmp_path, rank=0, stacks=False)
    tally = EpochTally(torch.device("cpu"))
    timer = StepTimer(progress, tally)
    with PreemptionWatch() as preemption:
        timer.start(7)
        for micro_batch in range(2):
            time.sleep(WAIT_S)  # awaiting the batch
            timer.fetched()
            time.sleep(COMPUTE_S)  # forward and backward
            if micro_batch == 0:
                timer.micro_batch_done(32)
                assert read_progress(tmp_path)[0].phase == "data"
        timer.computed(16)
        assert timer.step_done(preemption) == 0
        (record,) = read_progress(tmp_path)
        assert (record.step, record.steps_timed, record.samples, record.phase) == (8, 1, 48, "collective")
        assert record.compute_s >= 2 * COMPUTE_S and record.wait_s >= 2 * WAIT_S
        assert record.compute_s < 2 * COMPUTE_S + WAIT_S  # the waits are not compute

        timer.to_tally()  # a checkpoint would hold this much
        held = tally.train_s
        assert held >= 2 * (WAIT_S + COMPUTE_S)
        timer.fetching(8)
        assert read_progress(tmp_path)[0].phase == "data"
        signal.raise_signal(signal.SIGTERM)  # one process: the next check answers at once
        timer.fetched()
        timer.computed(32)
        assert timer.step_done(preemption) == signal.SIGTERM
        timer.stop()
        assert tally.train_s > held
        assert read_progress(tmp_path)[0].steps_timed == 2
    progress.close()
