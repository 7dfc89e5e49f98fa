"""Settings: every bad value is refused at load with the variable's name, before any process starts."""

from __future__ import annotations

import dataclasses

import pytest

from streamer.config import ENV_VARS, RANGES, Settings, load_settings


@pytest.mark.parametrize("env, name", [
    ({"PORT": "-5"}, "PORT"), ({"PORT": "70000"}, "PORT"),
    ({"MAX_QUEUE": "-1"}, "MAX_QUEUE"), ({"MAX_QUEUE": "0"}, "MAX_QUEUE"),
    ({"DTYPE": "int8"}, "DTYPE"), ({"DEVICE": "gpu"}, "DEVICE"), ({"DEVICE": "cuda:0,gpu"}, "DEVICE"),
    ({"PRECISION": "fp4"}, "PRECISION"), ({"PRECISION": "full_fp16:cross_kv_cache=zip"}, "PRECISION"),
    ({"SHUTDOWN_GRACE_S": "nan"}, "SHUTDOWN_GRACE_S"), ({"IDLE_TIMEOUT_S": "inf"}, "IDLE_TIMEOUT_S"),
    ({"WORKERS": "-1"}, "WORKERS"), ({"MAX_SESSIONS": "-3"}, "MAX_SESSIONS"),
    ({"IDLE_TIMEOUT_S": "-1"}, "IDLE_TIMEOUT_S"), ({"MAX_OUTBOX_BYTES": "-1"}, "MAX_OUTBOX_BYTES"),
    ({"MODE": "bogus"}, "MODE"), ({"GATEWAY_ACCEPT": "random"}, "GATEWAY_ACCEPT"),
    ({"MAX_UPLOAD_MB": "-1"}, "MAX_UPLOAD_MB"), ({"PARTIAL_INTERVAL_S": "0"}, "PARTIAL_INTERVAL_S"),
    ({"PARTIAL_INTERVAL_S": "6"}, "PARTIAL_INTERVAL_MAX_S"), ({"ACOUSTIC_CONTEXT": "maybe"}, "ACOUSTIC_CONTEXT"),
    ({"CUDA_GRAPHS": "yes please"}, "CUDA_GRAPHS"), ({"MAX_SLOTS": "1.5"}, "MAX_SLOTS"),
    ({"VAD_BATCH_MS": "5000"}, "VAD_BATCH_MS"), ({"SSL_CERTFILE": "/tmp/cert.pem"}, "SSL_KEYFILE"),
    ({"WEBRTC_ICE_SERVERS": "stun:example"}, "WEBRTC_ICE_SERVERS"), ({"CPU_ENCODER": "int8"}, "CPU_ENCODER"),
    ({"UPLOAD_AUDIO_BUDGET_S": "0"}, "UPLOAD_AUDIO_BUDGET_S"), ({"UPLOAD_AUDIO_BUDGET_S": "3600"}, "UPLOAD_AUDIO_BUDGET_S"),
    ({"UPLOAD_SPOOL_DIR": "/nonexistent/spool"}, "UPLOAD_SPOOL_DIR"), ({"FILL_FILES_FIRST": "sometimes"}, "FILL_FILES_FIRST"),
])
def test_a_bad_value_is_refused_naming_its_variable(env, name):
    with pytest.raises(ValueError, match=name):
        load_settings(env)


def test_cli_flags_are_checked_like_variables():
    with pytest.raises(ValueError, match="PORT"):
        load_settings({}, server={"port": -1})
    with pytest.raises(ValueError, match="WORKERS"):
        load_settings({}, server={"workers": 10_000})


@pytest.mark.parametrize("env", [
    {}, {"DEVICE": "cuda:0,cuda:1"}, {"DEVICE": "cpu,cpu"}, {"DEVICE": "cuda:3"}, {"PRECISION": "full_fp16:cross_kv_cache=auto"},
    {"ACOUSTIC_CONTEXT": "off", "CUDA_GRAPHS": "1", "ASYNC_STEPS": ""}, {"MAX_BACKLOG_S": "0", "RESUME_S": "0"},
    {"MAX_SLOTS": "", "WORKERS": "0", "PORT": "0", "MAX_CONNECTIONS_PER_CLIENT": "0"},
    {"UPLOAD_AUDIO_BUDGET_S": "14400"}, {"UPLOAD_AUDIO_BUDGET_S": "60", "MAX_AUDIO_S": "60"},
])
def test_good_values_load(env):
    load_settings(env)


def test_every_default_is_in_range_and_every_range_names_a_field():
    load_settings({})  # the defaults pass their own checks
    defaults = Settings()
    fields = {(s.name, f.name) for s in dataclasses.fields(defaults) for f in dataclasses.fields(getattr(defaults, s.name))}
    assert set(RANGES) <= fields
    assert {key for key in ENV_VARS.values()} <= fields
