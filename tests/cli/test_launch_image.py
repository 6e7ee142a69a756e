"""``shoal launch image`` from the command line: every bad input is one line and a HINT that names
only what exists, a non-zero exit, and no file written or changed (a user's Dockerfile above all)."""

from __future__ import annotations

import os

import pytest

from conftest import run_shoal

USERS_DOCKERFILE = b"FROM python:3.11\r\nRUN pip install mine  \n# no newline at the end"
USERS_IGNORE = b"data/\n"


def _assert_one_line_with_hint(result, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr  # no usage block, no traceback
    assert lines[0].startswith("shoal: error: ") and lines[1].startswith("HINT: "), result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert result.stdout == "", result.stdout
    return lines[1]


def _existing_flags() -> set[str]:
    help_text = run_shoal("launch", "image", "--help").stdout
    return {word.strip("[],") for word in help_text.split() if word.startswith("--")}


def _flags_named(hint: str) -> set[str]:
    return {word.strip("`.,;:()") for word in hint.split() if word.startswith("--")}


BAD_INPUT = [
    (["--", "/abs/train.py"], "lies outside the build context"),
    (["--requirements", "../req.txt", "--", "train.py"], "lies outside the build context"),
    (["--requirements", "missing.txt", "--", "train.py"], "--requirements missing.txt: no such file"),
    (["--base-image", "", "--", "train.py"], "--base-image '' is not a single word"),
    (["--base-image", "a\nRUN rm -rf /", "--", "train.py"], "is not a single word"),
    (["--shoal-requirement", "shoal extra", "--", "train.py"], "--shoal-requirement 'shoal extra'"),
    ([], "no command given"),
    (["--"], "no command given"),
    (["--file", "Dockerfile.gpu", "--", "train.py"], "no such option: --file"),
    (["--output=out", "--", "train.py"], "no such option: --output"),
    (["--no-such-flag", "--", "train.py"], "unknown flag --no-such-flag"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUT, ids=[" ".join(a)[:40] or "nothing" for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_with_a_hint_and_writes_nothing(argv, message, tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    hint = _assert_one_line_with_hint(run_shoal("launch", "image", *argv, cwd=tmp_path), message)
    assert _flags_named(hint) <= _existing_flags(), f"the HINT names a flag that does not exist: {hint}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize("foreign", ["Dockerfile", ".dockerignore"])
def test_a_users_file_stays_byte_identical_and_the_hint_offers_what_exists(foreign, tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    mine = USERS_DOCKERFILE if foreign == "Dockerfile" else USERS_IGNORE
    (tmp_path / foreign).write_bytes(mine)
    result = run_shoal("launch", "image", "--image", "me/train:1", "--", "train.py", cwd=tmp_path)
    hint = _assert_one_line_with_hint(result, f"{foreign} exists and was not written by shoal launch image")
    assert _flags_named(hint) == {"--dry-run"} and f"mv {foreign}" in hint, hint
    assert (tmp_path / foreign).read_bytes() == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["train.py", foreign]), "neither file written"

    # What the hint offers works: --dry-run prints both files and leaves the user's alone.
    printed = run_shoal("launch", "image", "--dry-run", "--", "train.py", cwd=tmp_path)
    assert printed.returncode == 0 and 'ENTRYPOINT ["shoal"]' in printed.stdout, printed.stderr
    assert (tmp_path / foreign).read_bytes() == mine
    (tmp_path / foreign).rename(tmp_path / f"{foreign}.mine")
    written = run_shoal("launch", "image", "--", "train.py", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert 'CMD ["run", "train.py"]' in (tmp_path / "Dockerfile").read_text()


def test_a_directory_named_dockerfile_is_an_error_not_a_traceback(tmp_path):
    (tmp_path / "Dockerfile").mkdir()
    (tmp_path / "Dockerfile" / "keep").write_text("x")
    result = run_shoal("launch", "image", "--", "train.py", cwd=tmp_path)
    _assert_one_line_with_hint(result, "Dockerfile is a directory")
    assert (tmp_path / "Dockerfile" / "keep").read_text() == "x"
    assert not (tmp_path / ".dockerignore").exists()


def test_help_names_the_fixed_file_names():
    result = run_shoal("launch", "image", "--help")
    assert result.returncode == 0 and "./Dockerfile and ./.dockerignore" in result.stdout.replace("\n", " ")


def _checkout() -> str | None:
    """The checkout shoal runs from here (``pip install -e .``), else None."""
    import json
    from importlib.metadata import distribution
    from urllib.parse import unquote, urlparse

    origin = json.loads(distribution("shoal").read_text("direct_url.json") or "{}")
    return unquote(urlparse(origin["url"]).path) if "dir_info" in origin else None


@pytest.mark.skipif(_checkout() is None, reason="shoal is not installed from a checkout here")
def test_the_image_installs_the_shoal_that_runs_here_not_an_index_release(tmp_path):
    """Issue 49: no package index serves shoal, so by default the image installs what runs here: a
    wheel built from its checkout into the build context (the checkout left as it was), copied in
    and installed; the wheel holds shoal (imported from it alone)."""
    import subprocess
    import sys
    from importlib.metadata import version

    checkout, here = _checkout(), version("torch").split("+")[0]
    wheel = f"shoal-{version('shoal')}-py3-none-any.whl"
    (tmp_path / "train.py").write_text("print('hi')\n")
    base = ["--base-image", f"pytorch/pytorch:{here}-cpu"]  # this machine's torch: no note about it
    printed = run_shoal("launch", "image", *base, "--dry-run", "--", "train.py", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert printed.stderr.splitlines() == [
        f"shoal launch: the image installs {wheel}, a wheel of the checkout shoal runs from ({checkout}), built "
        "into this directory when the files are written"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # --dry-run writes nothing
    before = sorted(os.listdir(checkout))
    written = run_shoal("launch", "image", *base, "--", "train.py", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert written.stderr.splitlines() == [
        f"shoal launch: built {wheel} from the checkout shoal runs from ({checkout}); the image installs it",
        "shoal launch: wrote Dockerfile and .dockerignore; build and push the image with:",
    ]
    assert sorted(os.listdir(checkout)) == before  # no build/ left in the user's checkout
    lines = (tmp_path / "Dockerfile").read_text().splitlines()
    assert lines[lines.index("WORKDIR /workspace") + 1 :][:3] == [
        f"COPY {wheel} ./{wheel}",
        f"RUN pip install --no-cache-dir ./{wheel}",
        "COPY . ./",
    ]
    assert not any("shoal==" in line for line in lines)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site)]
    subprocess.run([*pip, str(tmp_path / wheel)], check=True, capture_output=True, timeout=300)
    assert (site / "shoal" / "horovod" / "shim" / "horovod" / "tensorflow" / "keras.py").is_file()  # --horovod-shim's
    code = "import shoal, shoal.cli.main; print(shoal.__file__)"  # no torch here: -S, only the wheel's files
    found = subprocess.run(
        [sys.executable, "-S", "-c", code], env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0 and found.stdout.strip() == str(site / "shoal" / "__init__.py"), found.stderr
