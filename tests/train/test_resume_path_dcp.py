"""``--resume PATH`` takes a sharded ``ckpt-*.dcp`` directory as it takes a ``.pt`` file (issue 21)."""

import pytest

import shoal
from shoal.errors import ShoalError


def test_resume_path_accepts_a_sharded_checkpoint_and_refuses_a_missing_one(tmp_path):
    small = {"arch": "tiny", "samples": 128, "progress": False}
    first = shoal.fit("language", strategy="fsdp", epochs=1, out=str(tmp_path / "a"), **small)
    (saved,) = sorted((first.run_dir / "checkpoints").glob("ckpt-*.dcp"))
    resumed = shoal.fit("language", epochs=2, out=str(tmp_path / "b"), resume=str(saved), **small)
    assert [m["epoch"] for m in resumed.metrics] == [2]  # epoch 1 was trained by the checkpoint's run
    assert resumed.metrics[0]["samples_seen"] == first.metrics[0]["samples_seen"]
    with pytest.raises(ShoalError, match="no such checkpoint") as err:
        shoal.fit("language", arch="tiny", epochs=2, out=str(tmp_path / "c"), resume=str(tmp_path / "x.dcp"))
    assert ".dcp" in err.value.hint
