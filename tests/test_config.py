"""BuildConfig: every setting's rules, messages and precedence (docs/DESIGN.md §1.3)."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import warnings

import pytest

from ascendc_pack import config as config_mod
from ascendc_pack.config import MAX_TOPN, BuildConfig, ConfigWarning, host_cores
from ascendc_pack.errors import ConfigError, PackError

TOPN = "TORCHINDUCTOR_ASCENDC_AUTOTUNE_TOPN"


def resolve(env=None, **kw) -> BuildConfig:
    return BuildConfig.resolve(env=env or {}, **kw)


def test_defaults_without_env():
    cfg = resolve()
    assert cfg.topn == 1 and cfg.debug is False and cfg.cores is None and cfg.march == "native"
    assert cfg.jobs == min(host_cores(), 32)
    assert cfg.cache_dir.parent == config_mod.Path(tempfile.gettempdir())
    assert cfg.cache_dir.name.startswith("torchinductor_")
    assert cfg.kernel_cache_root == cfg.cache_dir / "ascendc"
    assert cfg.effective_cores == host_cores()


def test_host_cores_is_the_affinity_mask():
    assert host_cores() == len(os.sched_getaffinity(0)) >= 1


# ----------------------------------------------------------------------------- topn


@pytest.mark.parametrize("raw", ["abc", "1.5", "", " ", "4x", "0x10"])
def test_topn_invalid_string_exact_message(raw):
    msg = f"{TOPN} must be a positive integer, got: {raw!r}"
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve(topn=raw)  # explicit (CLI/API) value
    if raw.strip():  # an empty env var counts as unset
        with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
            resolve({TOPN: raw})


@pytest.mark.parametrize("raw,n", [("0", 0), ("-3", -3)])
def test_topn_below_one_exact_message(raw, n):
    msg = f"{TOPN} must be >= 1, got: {n}"
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve({TOPN: raw})
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve(topn=n)
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve(topn=raw)


def test_topn_errors_are_value_errors_and_pack_errors():
    with pytest.raises(ValueError):
        resolve(topn=0)
    with pytest.raises(PackError):
        resolve(topn="x")
    with pytest.raises(ConfigError, match=re.escape("got: 'True'")):
        resolve(topn=True)


@pytest.mark.parametrize("source", ["env", "explicit"])
def test_topn_above_ten_warns_and_clamps(source):
    kw = {"env": {TOPN: "25"}} if source == "env" else {"topn": 25}
    with pytest.warns(ConfigWarning, match=r"25.*maximum of 10.*using 10"):
        cfg = BuildConfig.resolve(**{"env": {}, **kw})
    assert cfg.topn == MAX_TOPN == 10


def test_topn_valid_values_and_precedence():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve({TOPN: "4"}).topn == 4
        assert resolve({TOPN: " 10 "}).topn == 10
        assert resolve({TOPN: ""}).topn == 1
        assert resolve({TOPN: "4"}, topn=2).topn == 2      # explicit wins over env
        assert resolve({TOPN: "abc"}, topn="3").topn == 3  # env is not even read


def test_topn_from_process_environment(monkeypatch):
    monkeypatch.setenv(TOPN, "3")
    assert BuildConfig.resolve().topn == 3


# ----------------------------------------------------------------------------- cache dir


def test_cache_dir_env_explicit_and_expansion(tmp_path, monkeypatch):
    assert resolve({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "e")}).cache_dir == tmp_path / "e"
    cfg = resolve({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "e")}, cache_dir=tmp_path / "x")
    assert cfg.cache_dir == tmp_path / "x"
    assert cfg.kernel_cache_root == tmp_path / "x" / "ascendc"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve(cache_dir="~/c").cache_dir == tmp_path / "c"
    monkeypatch.chdir(tmp_path)
    rel = resolve(cache_dir="rel").cache_dir
    assert rel.is_absolute() and rel == tmp_path / "rel"
    assert resolve({"TORCHINDUCTOR_CACHE_DIR": ""}).cache_dir == config_mod.default_cache_dir()


def test_cache_dir_that_is_a_file_is_rejected(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="TORCHINDUCTOR_CACHE_DIR must be a directory"):
        resolve({"TORCHINDUCTOR_CACHE_DIR": str(f)})
    with pytest.raises(ConfigError, match="--cache-dir must be a directory"):
        resolve(cache_dir=f)
    with pytest.raises(ConfigError, match="empty"):
        resolve(cache_dir="")


def test_default_cache_dir_sanitizes_user(monkeypatch):
    monkeypatch.setattr(config_mod.getpass, "getuser", lambda: "dom\\a b/c")
    assert config_mod.default_cache_dir().name == "torchinductor_dom_a_b_c"

    def no_user():
        raise KeyError("no passwd entry")

    monkeypatch.setattr(config_mod.getpass, "getuser", no_user)
    assert config_mod.default_cache_dir().name == f"torchinductor_uid{os.getuid()}"


# ----------------------------------------------------------------------------- jobs


def test_jobs_env_explicit_default_and_cap(monkeypatch):
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "3"}
    assert resolve(env).jobs == 3
    assert resolve(env, jobs=1).jobs == 1
    assert resolve(env, jobs="2").jobs == 2
    assert resolve({"TORCHINDUCTOR_COMPILE_THREADS": "100"}).jobs == 32
    monkeypatch.setattr(config_mod, "host_cores", lambda: 64)
    assert resolve().jobs == 32
    monkeypatch.setattr(config_mod, "host_cores", lambda: 3)
    assert resolve().jobs == 3


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.0"])
def test_jobs_invalid(raw):
    with pytest.raises(ConfigError, match=rf"^TORCHINDUCTOR_COMPILE_THREADS must be a positive integer.*got: '{re.escape(raw)}'$"):
        resolve({"TORCHINDUCTOR_COMPILE_THREADS": raw})
    with pytest.raises(ConfigError, match=r"^--jobs \(TORCHINDUCTOR_COMPILE_THREADS\) must be a positive integer"):
        resolve(jobs=raw)


# ----------------------------------------------------------------------------- debug


def test_debug_env_and_explicit():
    assert resolve({"TORCH_COMPILE_DEBUG": "1"}).debug is True
    assert resolve({"TORCH_COMPILE_DEBUG": "0"}).debug is False
    assert resolve({"TORCH_COMPILE_DEBUG": "true"}).debug is False  # torch's rule: only "1"
    assert resolve({"TORCH_COMPILE_DEBUG": "1"}, debug=False).debug is False
    assert resolve(debug=True).debug is True


# ----------------------------------------------------------------------------- cores


def test_cores_valid(monkeypatch):
    assert resolve(cores=1).cores == 1
    assert resolve(cores=1).effective_cores == 1
    assert resolve(cores=host_cores()).cores == host_cores()
    monkeypatch.setattr(config_mod, "host_cores", lambda: 8)
    assert resolve(cores="6").cores == 6


@pytest.mark.parametrize("bad", [0, -1, "x", 1.5])
def test_cores_invalid(bad, monkeypatch):
    monkeypatch.setattr(config_mod, "host_cores", lambda: 4)
    with pytest.raises(ConfigError, match=rf"--cores must be an integer between 1 and 4 .*got: '{re.escape(str(bad))}'"):
        resolve(cores=bad)


def test_cores_above_host_names_value_and_host_count():
    n = host_cores()
    with pytest.raises(ConfigError) as ei:
        resolve(cores=n + 1)
    assert f"between 1 and {n}" in str(ei.value) and f"got: '{n + 1}'" in str(ei.value)


# ----------------------------------------------------------------------------- march, dataclass


def test_march():
    assert resolve(march="x86-64-v3").march == "x86-64-v3"
    for bad in ["", "-O0", "native -O0", "a;b"]:
        with pytest.raises(ConfigError, match="--march must be a g\\+\\+ -march= value"):
            resolve(march=bad)


def test_backend():
    assert resolve().backend == "cpu" and resolve(backend="cpu").backend == "cpu"
    assert resolve().to_json()["backend"] == "cpu"
    for bad in ["cuda", "CPU", "", 3]:
        with pytest.raises(ConfigError, match=re.escape(f"--backend must be one of cpu, npu, npu-emu, got: {bad!r}")):
            resolve(backend=bad)
    with pytest.raises(ConfigError, match="backend must be one of cpu, npu, npu-emu, got: 'cuda'"):
        BuildConfig(backend="cuda")


def test_config_is_frozen_and_validates_direct_construction(tmp_path):
    cfg = BuildConfig(cache_dir=tmp_path, jobs=2)
    assert cfg.topn == 1 and cfg.cache_dir == tmp_path
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.topn = 3
    with pytest.raises(ConfigError):
        BuildConfig(topn=11, cache_dir=tmp_path, jobs=1)
    with pytest.raises(ConfigError):
        BuildConfig(cache_dir=tmp_path, jobs=0)
    assert cfg.to_json()["cache_dir"] == str(tmp_path)
