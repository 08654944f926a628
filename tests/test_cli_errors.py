"""Bad values a new user gives the `netcl` subcommands: each ends in one clear error naming the flag, before
anything runs or is written (the rest of the CLI's refusals are tested beside each command)."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from netcl import cli
from netcl.cli import announce_kernel_builds, main
from netcl.core.backend import build_program, driver_keeps_programs
from netcl.models import GPT, GPTConfig
from netcl.text import BPETokenizer
from netcl.train import lm as lm_main
from netcl.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["tune", "--limit", "0"], "argument --limit: must be an integer >= 1, got 0"),
        (["tune", "--limit", "-1"], "argument --limit: must be an integer >= 1, got -1"),
        (["tune", "--size", "x"], "argument --size: size must be N or MxNxK, got 'x'"),
        (["profile", "--top", "0", "script.py"], "argument --top: must be a positive integer, got 0"),
        # a seed of 2**64 wrapped onto seed 0's stream
        (["train", "--seed", str(1 << 64)], "argument --seed: must be an integer <= 18446744073709551615"),
        (["lm-train", "--seed", str(1 << 70)], "argument --seed: must be an integer <= 18446744073709551615"),
    ],
)
def test_bad_numbers_are_argparse_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["tune", "--reset", "--dry-run"], "--reset measures nothing, so --dry-run would be ignored"),
        (["tune", "--show", "--reset"], "--show and --reset are separate actions"),
        (["tune", "--show", "--limit", "3", "--dtype", "float64"], "so --dtype, --limit would be ignored"),
    ],
)
def test_tune_modes_that_would_ignore_a_flag_are_refused(argv, words, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "netcl: netcl" not in err
    assert not list(tmp_path.iterdir())  # --reset --dry-run forgot nothing


def test_profile_refuses_a_bad_trace_path_before_the_script_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["profile", "--trace", str(tmp_path), str(script)]) == 1
    assert main(["profile", "--trace", str(script / "t.json"), str(script)]) == 1
    err = capsys.readouterr().err
    assert f"--trace {tmp_path} is a directory" in err and "is not a writable directory" in err
    assert "Traceback" not in err and not marker.exists()
    assert main(["profile", str(tmp_path / "missing.py")]) == 1
    assert "netcl: no script" in capsys.readouterr().err


def test_train_nproc_checks_device_before_starting_ranks(tmp_path, capsys):
    assert main(["train", "--dataset", "digits", "--nproc", "2", "--device", "9:9",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--device 9:9: no device at index 9:9" in err and "netcl run: rank" not in err
    assert not (tmp_path / "r").exists()


def _tiny_model_dir(path, queue):
    tok = BPETokenizer.train("def f(x):\n    return x\n" * 20, 280,
                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    gpt = GPT(queue, GPTConfig(vocab_size=tok.n_vocab, dim=16, n_layers=1, n_heads=2, max_seq_len=16))
    gpt.save_pretrained(path)
    tok.save_hf(path / "tokenizer.json")


def test_generate_prompt_may_hold_special_tokens(tmp_path, capsys, queue):
    _tiny_model_dir(tmp_path, queue)
    code = main(["generate", "--checkpoint", str(tmp_path), "--prompt", "<|endoftext|>def",
                 "--max-new-tokens", "2", "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("<|endoftext|>def"), err


@pytest.mark.parametrize("command", ["train", "lm-train"])
def test_resume_with_overwrite_is_a_contradiction(command, tmp_path, capsys):
    assert main([command, "--resume", "--overwrite", "--out", str(tmp_path / "r"), "--no-progress"]) == 1
    assert "--resume continues a run and --overwrite replaces it" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("module", [train_main, lm_main])
def test_overwrite_without_out_replaces_the_default_run(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default = module.DEFAULT_OUT
    default.mkdir(parents=True)
    (default / "metrics.json").write_text("{}")
    args = argparse.Namespace(resume=None, out=None, overwrite=True)
    assert module._plan_output(args, print)[0] == default  # not runs/NAME-2, which ignored --overwrite
    args.overwrite = False
    assert module._plan_output(args, print)[0] == default.parent / f"{default.name}-2"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--out", ""], "argument --out: expected a path, got an empty string"),
        (["train", "--data-dir", " "], "argument --data-dir: expected a path, got an empty string"),
        (["lm-train", "--cache-dir", ""], "argument --cache-dir: expected a path, got an empty string"),
        (["lm-train", "--corpus", ""], "argument --corpus: expected a path, got an empty string"),
        (["train", "--tensorboard", ""], "argument --tensorboard: expected a directory, got an empty string"),
    ],
)
def test_empty_paths_are_refused_not_the_current_directory(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_a_tensorboard_file_is_refused_before_the_run_starts(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        main(["train", "--dataset", "digits", "--out", str(tmp_path / "r"),
              "--tensorboard", str(tmp_path / "file")])
    assert "exists and is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # was made empty before the writer failed


def test_python_dash_m_netcl_is_the_command():
    done = subprocess.run([sys.executable, "-m", "netcl", "tune", "--limit", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "argument --limit: must be an integer >= 1" in done.stderr


def test_train_resume_takes_a_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--model", "mlp", "--epochs", "1", "--out", str(out),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0  # was "no checkpoint at <dir>"
    assert "already trained 1 of 1 epochs" in capsys.readouterr().out


def test_profile_keeps_a_scripts_exit_message(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.exit('bad input: need --n')\n")
    assert main(["profile", "--trace", str(tmp_path / "t.json"), str(script)]) == 1
    assert "bad input: need --n" in capsys.readouterr().err  # was swallowed


def test_tune_refuses_a_size_the_device_cannot_hold(capsys, monkeypatch, tmp_path):
    """A --size whose A, B and C exceed the device (a host array of 37 GiB was a raw numpy MemoryError):
    one line naming the bytes, the device and what to do, nothing measured or stored."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    for size in ("100000", "1x1x100000000000"):
        assert main(["tune", "--size", size, "--limit", "1"]) == 1
        err = capsys.readouterr().err
        assert "GEMM's A, B and C take" in err and "pick a smaller --size" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_tune_names_its_device_flag(capsys):
    assert main(["tune", "--show", "--device", "9:9"]) == 1
    assert "netcl: --device 9:9: no device at index 9:9; devices here:" in capsys.readouterr().err


def test_run_names_its_devices_flag(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    assert main(["run", "--nproc", "2", "--devices", "9:9", str(script)]) == 1
    assert "netcl: --devices 9:9: no device at index 9:9" in capsys.readouterr().err


def test_chat_warns_of_a_system_message_that_fills_the_context(tmp_path, capsys, queue, monkeypatch):
    _tiny_model_dir(tmp_path, queue)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["chat", "--checkpoint", str(tmp_path), "--system", "return x " * 20]) == 0
    err = capsys.readouterr().err  # it was cut from its start without a word
    assert "--system is" in err and "loses the start of the system message" in err


def test_a_first_build_is_announced_once(tmp_path, monkeypatch, capsys, device):
    """`make run` sat at step 0 for 44 s while PoCL compiled, with nothing said: the first program compiled
    from source says so once; one loaded from the disk cache says nothing."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_DISK_CACHE", "1")  # netcl's disk cache on, whatever the driver
    tag = uuid.uuid4().hex[:8]  # sources no driver's own cache has seen
    sources = [f"__kernel void first_build_{tag}_{i}(__global float* x) {{ x[0] = {i}; }}" for i in range(3)]
    with announce_kernel_builds():
        for source in sources[:2]:  # two compiled: one line
            build_program(device, source)
        build_program(device, sources[0])  # from the disk cache
    build_program(device, sources[1] + " ")  # compiled outside: nothing
    assert capsys.readouterr().err == (
        f"netcl: building OpenCL kernels for {device.device_name} (kept in {tmp_path / 'programs'}, so later "
        "runs skip this)\n")
    with announce_kernel_builds():
        for source in sources[:2]:
            build_program(device, source)  # both from the disk cache
    assert capsys.readouterr().err == ""
    # netcl's cache off: a build counts when it took longer than one from a driver's own cache
    monkeypatch.setenv("NETCL_DISK_CACHE", "0")
    monkeypatch.setattr(cli, "SLOW_BUILD_SECONDS", 1e9)
    with announce_kernel_builds():
        build_program(device, sources[2])
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli, "SLOW_BUILD_SECONDS", 0.0)
    with announce_kernel_builds():
        build_program(device, sources[2])
    later = (f"{device.platform_name} keeps them in its own cache" if driver_keeps_programs(device)
             else "NETCL_DISK_CACHE=0: every run builds them again")
    assert later in capsys.readouterr().err
    monkeypatch.setenv("NETCL_RANK", "1")
    monkeypatch.setenv("NETCL_WORLD_SIZE", "2")
    monkeypatch.setenv("NETCL_DIST_ID", "job")
    with announce_kernel_builds():
        build_program(device, sources[1])
    assert capsys.readouterr().err == ""  # rank 0 speaks for a data-parallel job


def test_a_command_from_cold_caches_says_it_is_building(tmp_path):
    env = {**os.environ, "NETCL_CACHE_DIR": str(tmp_path), "NETCL_DISK_CACHE": "1"}
    runs = [subprocess.run([sys.executable, "-m", "netcl", "demo"], capture_output=True, text=True,
                           timeout=300, env=env, cwd=ROOT) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stderr.count("netcl: building OpenCL kernels for ") == 1
    assert runs[1].stderr == ""  # the second run loads them: nothing said
