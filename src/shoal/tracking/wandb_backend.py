"""Weights & Biases: online when an API key is configured and the server answers, offline otherwise.

How the mode is chosen (no prompt, never a hang):

1. ``WANDB_MODE`` when set (``online``, ``offline``, ``disabled``): the user decided.
2. Otherwise online if wandb finds credentials the way ``wandb.init`` would (``WANDB_API_KEY``,
   ``WANDB_IDENTITY_TOKEN_FILE``, ``~/.netrc``, wandb's settings file), else offline: without a
   key ``wandb.init`` would prompt on a terminal, or fail without one.
3. An online run that cannot be opened within ``init_timeout`` (no network, server down, bad key)
   is opened offline instead, with the same run id.

Offline runs are written under ``RUN_DIR/wandb`` and uploaded later with ``wandb sync RUN_DIR/wandb``
(the tracker says so once); a resumed job writes a second offline directory with the same run id,
and ``wandb sync`` replays them in start-time order into one run.

Resume reopens the same run (``id`` + ``resume="allow"``). W&B keeps only increasing steps
(wandb/wandb issue #9449, core/internal/stream/handler.go), so for steps the interrupted attempt
logged after its checkpoint, the run keeps that attempt's values.
"""

from __future__ import annotations

import os
import secrets
import string
import struct
import time
from collections.abc import Mapping
from typing import Any

from shoal.tracking.backend import Backend
from shoal.tracking.predictions import Predictions

_ID_ALPHABET = string.ascii_lowercase + string.digits  # what wandb's own generate_id draws from
TRANSACTION_LOG_FLUSH_S = 0.2
"""How often wandb writes the run's transaction log (``x_transaction_log_flush_interval``, where the
installed wandb has it): a killed job loses at most this much of its W&B data, and a flush waits
about this long for it."""


class WandbBackend(Backend):
    name = "wandb"
    modules = ("wandb", "wandb.sdk.wandb_setup")
    optional_modules = ("PIL.Image", "wandb.sdk.data_types.image")  # wandb.Image's

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Chosen here, not by wandb, so the state is known before the run has even opened.
        previous = self.resume.state.get("run_id") if self.resume else None
        self.run_id: str = previous or "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))
        self.run: Any = None
        # W&B writes a step's row once it is committed, and drops anything logged at that step or
        # below afterwards; so values are gathered here per step and committed when a later step
        # arrives, on flush (a checkpoint) and on close.
        self.row: dict[str, Any] = {}
        self.row_step: int | None = None
        self.committed: int | None = None
        self.unwritten = False  # committed rows not yet seen in the transaction log
        self.log_tail: TransactionLogTail | None = None
        self.dropped = False

    @property
    def wandb_dir(self) -> str:
        return str(self.options.run_dir / "wandb")

    def open(self) -> None:
        import wandb

        sync = f"upload later with: wandb sync {self.wandb_dir}"
        chosen = os.environ.get("WANDB_MODE", "").strip().lower()
        if chosen in ("online", "offline", "disabled"):
            mode = chosen
            if mode == "offline":
                self.say(f"WANDB_MODE=offline: logging offline; {sync}")
        else:
            mode = "online" if _credentials_configured() else "offline"
            if mode == "offline":
                self.say(f"no W&B API key configured: logging offline; {sync}")
        if mode == "online":
            try:
                self.run = self._init(wandb, "online")
            except Exception as err:  # no network, server down, key refused: wandb raises many types
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
                self.say(f"could not open an online run ({reason}): logging offline; {sync}")
                mode = "offline"
                # wandb's service keeps the failed run's id taken ("run ID ... is in use"): end the
                # service (it holds nothing else that could reach the server now), then reopen offline.
                wandb.teardown()
        if self.run is None:
            self.run = self._init(wandb, mode)
        # Per-epoch records plot against the epoch; everything else against the global step.
        self.run.define_metric("epoch")
        self.run.define_metric("epoch/*", step_metric="epoch")

    def _init(self, wandb: Any, mode: str) -> Any:
        settings = {
            "console": "off",  # leave rank 0's stdout and stderr alone
            "silent": True,  # shoal says what matters, once
            "init_timeout": self.options.init_timeout,
        }
        if "x_transaction_log_flush_interval" in getattr(wandb.Settings, "model_fields", {}):
            # wandb-core writes the run's .wandb file every 15 s by default: a job killed in that
            # window loses what it logged since, and offline that file is the only copy.
            settings["x_transaction_log_flush_interval"] = TRANSACTION_LOG_FLUSH_S
        return wandb.init(
            project=self.options.project,
            name=self.options.run_name,
            id=self.run_id,
            resume="allow",
            dir=str(self.options.run_dir),
            mode=mode,
            reinit="create_new",  # never touch the user's own wandb.run
            settings=wandb.Settings(**settings),
        )

    def log_config(self, config: Mapping[str, Any], step: int) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_scalars(self, values: Mapping[str, float], step: int, timestamp: float) -> None:
        self._add(values, step)

    def _add(self, values: Mapping[str, Any], step: int) -> None:
        if self.row_step is not None and step > self.row_step:
            self._commit()
        if (self.committed is not None and step <= self.committed) or (self.row_step or 0) > step:
            if not self.dropped:
                self.say(
                    f"dropped step {step} (and will drop any other step below one already written): W&B keeps only increasing steps"
                )
            self.dropped = True
            return
        self.row.update(values)
        self.row_step = step

    def flush(self) -> None:
        """Commit the open row, then wait until wandb-core has written it to the run's transaction
        log: that file is an offline run's only copy, and a job killed right after a checkpoint
        must find there every step the checkpoint counts as logged.

        wandb-core writes the log in the background (every :data:`TRANSACTION_LOG_FLUSH_S`) and
        offers no call that waits for it, so the log is read back (:class:`TransactionLogTail`)
        until it holds the committed step, at most ``options.flush_timeout`` (a stalled wandb-core must
        not stall the job)."""
        self._commit()
        if not self.unwritten:
            return
        self.unwritten = False
        settings = self.run.settings
        path = getattr(settings, "sync_file", None)
        if not path or settings.mode == "disabled" or getattr(settings, "x_skip_transaction_log", False):
            return
        if self.log_tail is None or self.log_tail.path != path:
            self.log_tail = TransactionLogTail(path)
        deadline = time.monotonic() + self.options.flush_timeout
        while self.log_tail.last_step() < (self.committed or 0):
            if time.monotonic() > deadline:
                self.say(f"step {self.committed} was not in {path} after {self.options.flush_timeout:g} s; going on")
                return
            time.sleep(TRANSACTION_LOG_FLUSH_S / 4)

    def _commit(self) -> None:
        """Hand the open row to wandb (which writes it in the background)."""
        if self.row_step is not None:
            self.run.log(self.row, step=self.row_step, commit=True)
            self.committed, self.row, self.row_step = self.row_step, {}, None
            self.unwritten = True

    def log_predictions(self, name: str, predictions: Predictions, step: int) -> None:
        import wandb

        table = wandb.Table(columns=predictions.columns)
        for row_id, image, guess, truth, scores in predictions.rows():
            table.add_data(row_id, wandb.Image(image), guess, truth, *scores)
        self._add({name: table}, step)

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "project": self.options.project}

    def close(self, failed: bool) -> None:
        self._commit()  # finish() writes everything before it returns
        self.run.finish(exit_code=1 if failed else 0)

    def unfinished_hint(self) -> str:
        return f"; its data is in {self.wandb_dir}: upload it with: wandb sync {self.wandb_dir}"


class TransactionLogTail:
    """The highest history step in a run's ``.wandb`` transaction log, read incrementally.

    The file is wandb's LevelDB-style log (wandb/sdk/internal/datastore.py in wandb < 0.20,
    core/pkg/leveldb in wandb-core): a 7-byte header, then 32 KiB blocks of records, each with a
    7-byte header (CRC, length, type: FULL, or FIRST/MIDDLE/LAST fragments of a longer record),
    a block's last bytes zero-padded when fewer than 7 remain. Each read resumes after the last
    complete record; a record cut short at the end of the file (still being written) waits for
    the next read.
    """

    HEADER = 7
    BLOCK = 32768

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = self.HEADER
        self.step = -1

    def last_step(self) -> int:
        from wandb.proto import wandb_internal_pb2

        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not created yet
            return self.step
        for raw, end in self._records(data):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.HasField("history"):
                self.step = max(self.step, record.history.step.num)
            self.offset = end
        return self.step

    def _records(self, data: bytes):
        """``(record bytes, file offset after it)`` for each complete record in ``data`` (the file
        from ``self.offset`` on)."""
        base, pos, pending = self.offset, 0, b""
        while True:
            left = self.BLOCK - (base + pos) % self.BLOCK
            if left < self.HEADER:
                pos += left
                continue
            if pos + self.HEADER > len(data):
                return
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + self.HEADER])
            if kind == 0:  # zero padding up to the block's end
                pos += left
                continue
            if pos + self.HEADER + length > len(data):
                return
            chunk = data[pos + self.HEADER : pos + self.HEADER + length]
            pos += self.HEADER + length
            if kind == 1:  # FULL
                yield chunk, base + pos
            elif kind == 2:  # FIRST
                pending = chunk
            elif kind == 3:  # MIDDLE
                pending += chunk
            elif kind == 4:  # LAST
                yield pending + chunk, base + pos


def _credentials_configured() -> bool:
    """Whether ``wandb.init`` would find credentials without asking (no network, no prompt)."""
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # a wandb without this module: only the environment variable is known
        return bool(os.environ.get("WANDB_API_KEY"))
    try:
        host = wandb_setup.singleton().settings.base_url
        # The lookup wandb.init does (wandb/sdk/lib/wbauth/authenticate.py, _use_system_auth):
        # environment, then .netrc, then wandb's settings; prompt=False never asks.
        found = wbauth.authenticate_session(host=host, source="shoal", prompt=False, update_session=False)
    except Exception:  # a malformed key or netrc: online would fail too
        return False
    return found is not None
