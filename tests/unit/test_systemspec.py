"""The typed system: parsed and checked where it enters, one line per malformed field; JSON round
trip; a candidate's configuration from the incumbent's and a variant's options."""

from __future__ import annotations

import json

import pytest

from specpilot.systemspec import (EngineSystem, ServerSystem, SystemSpecError, parse_system, server_program,
                                  with_options)

SERVER = {"server": {"url": "http://127.0.0.1:{port}", "api": "sglang",
                     "launch": ["python", "-m", "sglang.launch_server", "--port", "{port}"],
                     "args": {"--speculative-num-steps": 5}, "target": "/models/t"}}


def test_engine_and_server_round_trip():
    eng = parse_system({"engine": {"target": "/t", "mode": "chain"}, "patch": "", "base_rev": "abc"})
    assert eng == EngineSystem({"target": "/t", "mode": "chain"}, "", "abc")
    assert parse_system(json.loads(json.dumps(eng.to_json()))) == eng
    srv = parse_system(SERVER)
    assert isinstance(srv, ServerSystem) and srv.launch[0] == "python" and srv.ready_timeout == 600.0
    assert parse_system(json.loads(json.dumps(srv.to_json()))) == srv


def test_argv_fills_port_and_device_and_appends_flags():
    srv = parse_system({"server": {**SERVER["server"], "launch": ["serve", "--port", "{port}", "--device", "{device}"],
                                   "args": {"--draft-len": 4, "--flag": None, "--cfg": {"b": 2, "a": 1}}}})
    assert srv.argv(8123, "cuda:0") == ["serve", "--port", "8123", "--device", "cuda:0", "--draft-len", "4", "--flag",
                                        "--cfg", '{"a": 1, "b": 2}']


@pytest.mark.parametrize("bad, needle", [
    ([], "expected an object"),
    ({}, "exactly one of 'engine' or 'server'"),
    ({"engine": {}, "server": {}}, "exactly one of"),
    ({"engine": "t"}, "'engine' must be an object"),
    ({"engine": {"target": "t", "root": "/x"}}, "'root' is not an engine setting"),
    ({"engine": {"target": "t"}, "patch": "--- a\n+++ b\n"}, "needs 'base_rev'"),
    ({"engine": {"target": "t"}, "colour": 1}, "field 'colour' is unknown"),
    ({"server": {"url": "localhost:1"}}, "server field 'url'"),
    ({"server": {"url": "http://h:1", "api": "grpc"}}, "server field 'api'"),
    ({"server": {"url": "http://h:1", "launch": "sglang"}}, "server field 'launch'"),
    ({"server": {"url": "http://h:1", "launch": ["x"], "env": {"A": 1}}}, "server field 'env'"),
    ({"server": {"url": "http://h:1", "launch": ["x"], "args": {"steps": 3}}}, "server field 'args'"),
    ({"server": {"url": "http://h:1", "args": {"--steps": 3}}}, "'args' needs 'launch'"),
    ({"server": {"url": "http://h:1", "ready_timeout": 0}}, "ready_timeout"),
    ({"server": {"url": "http://h:1", "port": 3}}, "server field 'port' is unknown"),
    ({"server": {"url": "http://h:1"}, "patch": "x"}, "a server system has no 'patch'"),
])
def test_each_malformed_field_is_one_line_naming_it(bad, needle):
    with pytest.raises(SystemSpecError) as e:
        parse_system(bad, "deployment: stock")
    assert needle in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("deployment: stock")


def test_with_options_merges_engine_settings_and_server_flags():
    assert with_options({"target": "t", "mode": "chain"}, {"mode": "tree", "tree": "best-first:16"}) == \
        {"target": "t", "mode": "tree", "tree": "best-first:16"}
    cand = with_options(SERVER, {"server_program": "sglang", "server_args": {"--speculative-num-steps": 3,
                                                                               "--speculative-eagle-topk": 4}})
    assert cand["server"]["args"] == {"--speculative-num-steps": 3, "--speculative-eagle-topk": 4}
    assert SERVER["server"]["args"] == {"--speculative-num-steps": 5}  # the incumbent is not changed
    vllm = {"server": {"url": "http://h:{port}", "launch": ["vllm", "serve", "m"],
                       "args": {"--speculative-config": {"method": "eagle3", "num_speculative_tokens": 3}}}}
    merged = with_options(vllm, {"server_args": {"--speculative-config": {"num_speculative_tokens": 5}}})
    assert merged["server"]["args"]["--speculative-config"] == {"method": "eagle3", "num_speculative_tokens": 5}


def test_server_program_reads_the_command():
    assert server_program(SERVER) == "sglang"
    assert server_program({"server": {"launch": ["vllm", "serve", "m"]}}) == "vllm"
    assert server_program({"server": {"launch": ["specpilot", "serve", "engine"]}}) == "specpilot"
    assert server_program({"server": {"launch": None}}) is None
    assert server_program({"target": "t"}) is None
