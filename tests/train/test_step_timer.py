"""The training pass's clock (shoal.train.step.StepTimer) writing a real progress record: what a step
counts as compute and as wait (DDP's wait for the other ranks' gradients too), its samples over
micro-batches, and the epoch's seconds in the tally."""

import signal
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from shoal.preemption import PreemptionWatch
from shoal.progress import ProgressWriter, read_progress
from shoal.train.step import EpochTally, Step, StepTimer

WAIT_S, COMPUTE_S = 0.03, 0.05


def test_a_step_of_two_micro_batches_is_timed_and_counted(tmp_path):
    progress = ProgressWriter(tmp_path, rank=0, stacks=False)
    tally = EpochTally(torch.device("cpu"))
    timer = StepTimer(progress, tally)
    with PreemptionWatch() as preemption:
        slept = 0.0  # the waits as they really were, however much the sleeps overshot
        begun = time.perf_counter()
        timer.start(7)
        for micro_batch in range(2):
            asleep = time.perf_counter()
            time.sleep(WAIT_S)  # awaiting the batch
            slept += time.perf_counter() - asleep
            timer.fetched()
            time.sleep(COMPUTE_S)  # forward and backward
            if micro_batch == 0:
                timer.micro_batch_done(32)
                assert read_progress(tmp_path)[0].phase == "data"
        timer.computed(16)
        spanned = time.perf_counter() - begun
        assert timer.step_done(preemption) == 0
        (record,) = read_progress(tmp_path)
        assert (record.step, record.steps_timed, record.samples, record.phase) == (8, 1, 48, "collective")
        assert record.compute_s >= 2 * COMPUTE_S and record.wait_s >= 2 * WAIT_S
        assert record.compute_s <= spanned - slept  # the waits are not compute

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


LATE_S = 0.2


def _late_all_reduce(_state, bucket):
    """A comm hook whose all-reduce completes ``LATE_S`` after the bucket is ready, as when another
    rank is slower. The bucket is ready a little before the backward's computation ends (its last
    gradient, then the engine's bookkeeping), so the wait the step sees is a little under ``LATE_S``:
    how much under depends on the machine's load, hence the test's margin of half."""
    done = torch.futures.Future()
    threading.Timer(LATE_S, done.set_result, args=(bucket.buffer(),)).start()
    return done


def test_the_backwards_wait_for_the_other_ranks_is_wait_not_compute(tmp_path):
    """DDP waits for its all-reduces once the backward's computation is done: that much of a synced
    backward is :attr:`Step.waited_s`, which the clock counts as wait; none for a no_sync
    micro-batch, nor for a model outside DDP."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    progress = ProgressWriter(tmp_path, rank=0, stacks=False)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
        inputs, targets = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])
        plain = Step(model, torch.optim.SGD(model.parameters(), lr=0.1), "off", torch.device("cpu"))
        plain.micro_batch(inputs, targets, weight=1.0, sync=True)
        assert plain.waited_s == 0.0
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, _late_all_reduce)
        step = Step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), "off", torch.device("cpu"))
        step.micro_batch(inputs, targets, weight=0.5, sync=False)
        assert step.waited_s == 0.0
        step.micro_batch(inputs, targets, weight=0.5, sync=True)
        assert step.waited_s >= LATE_S / 2, step.waited_s  # counted: a no_sync backward's is 0
        assert step.waited_s < LATE_S + 0.5, step.waited_s  # not the whole run's clock

        timer = StepTimer(progress, EpochTally(torch.device("cpu")))
        with PreemptionWatch() as preemption:
            timer.start(0)
            before = time.perf_counter()
            timer.fetched()
            time.sleep(COMPUTE_S)  # forward, backward and the optimizer step, the wait included
            timer.computed(4, WAIT_S)
            spanned = time.perf_counter() - before
            timer.step_done(preemption)
        (record,) = read_progress(tmp_path)
        # the given wait comes out of compute, whatever the sleep overshot: bounds from own clock
        assert COMPUTE_S - WAIT_S <= record.compute_s <= spanned - WAIT_S, (record, spanned)
        assert record.wait_s >= WAIT_S, record
    finally:
        progress.close()
        dist.destroy_process_group()
