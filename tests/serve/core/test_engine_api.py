"""serve/core/engine_api.py: the one typed record of an engine's end-of-request figures, built once from what an
engine pass reports (the BDONE line's figures, the slot's reuse, the replica), merged over a reply's passes into
llama.cpp's timings; and the EngineClient surface StrataEngine and ReplicaEngine implement."""
import dataclasses
import typing

import pytest

from serve.core.engine_api import EngineClient, EngineFigures
from serve.engine_client.engine import StrataEngine
from serve.engine_client.protocol import parse_bdone
from serve.engine_client.replicas import ReplicaEngine
from tests.conftest import fake_argv


def _pass(line, **scratch):
    """What an engine pass leaves behind: the BDONE line's figures plus the state it kept on the way."""
    return EngineFigures.of({**scratch, **parse_bdone(line)})


def test_a_pass_becomes_typed_figures_once_and_keeps_what_it_does_not_know():
    fig = _pass("BDONE 0 12 stop 80.5 40 20.0 8 32 drafts_acc=3 drafts_off=5 drafts_n=2 newer_key=7",
                prompt_reached=40, embedding="4 AAAA", replica=1)
    assert (fig.generated, fig.finish, fig.decode_ms, fig.prompt, fig.prompt_ms) == (12, "stop", 80.5, 40, 20.0)
    assert (fig.reused, fig.prompt_read, fig.drafts_acc, fig.drafts_off, fig.drafts_n) == (8, 32, 3, 5, 2)
    assert fig.replica == 1 and fig.extra == {"newer_key": 7}     # the pass's scratch (embedding, ...) is not kept
    assert fig.hits is None and fig.experts_hits is None          # not reported: None, never 0
    assert fig.as_dict() == {"finish": "stop", "generated": 12, "prompt": 40, "prompt_ms": 20.0, "decode_ms": 80.5,
                             "reused": 8, "prompt_read": 32, "drafts_off": 5, "drafts_acc": 3, "drafts_n": 2,
                             "replica": 1, "newer_key": 7}


def test_a_not_measured_figure_stays_none():
    fig = _pass("BDONE 2 0 cancel - 10 - 0 10")
    assert fig.decode_ms is None and fig.prompt_ms is None and fig.finish == "cancel"
    assert "decode_ms" not in fig.as_dict()


def test_passes_merge_times_and_drafts_summed_the_rest_from_the_first_finish_from_the_last():
    first = _pass("BDONE 0 30 length 300.0 50 25.0 10 40 drafts_off=4 drafts_acc=2")
    second = _pass("BDONE 0 5 stop 50.0 84 3.0 80 4")
    both = first.merged(second)
    assert (both.prompt_ms, both.decode_ms, both.drafts_off, both.drafts_acc) == (28.0, 350.0, 4, 2)
    assert (both.reused, both.prompt, both.generated, both.finish) == (10, 50, 30, "stop")
    assert (first.decode_ms, first.finish) == (300.0, "length")    # merging makes a new record
    assert EngineFigures().merged(second) == second                # a first pass that reported nothing
    assert first.merged(EngineFigures()).finish == "length"        # a pass cut before its BDONE keeps the end


def test_timings_in_llama_cpps_names():
    t = _pass("BDONE 0 16 stop 150.0 40 20.0 10 30 drafts_off=6 drafts_acc=4").timings(40, 16)
    assert t == {"cache_n": 10, "prompt_n": 30, "prompt_ms": 20.0, "prompt_per_token_ms": 20.0 / 30,
                 "prompt_per_second": 1e3 * 30 / 20.0, "predicted_n": 16, "predicted_ms": 150.0,
                 "predicted_per_token_ms": 10.0, "predicted_per_second": 100.0, "draft_n": 6, "draft_n_accepted": 4}
    assert EngineFigures().timings(7, 0) == {"cache_n": 0, "prompt_n": 7, "predicted_n": 0}


def _members(protocol) -> set[str]:
    names = set(typing.get_type_hints(protocol)) if hasattr(protocol, "__annotations__") else set()
    names |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return names


def test_strata_engine_and_the_replica_set_have_the_whole_engine_client_surface(tmp_path):
    single = StrataEngine(fake_argv(tmp_path), [], log_path=str(tmp_path / "a.log"))
    other = StrataEngine(fake_argv(tmp_path), [], log_path=str(tmp_path / "b.log"))
    replicas = ReplicaEngine([single, other], pin=False)
    wanted = _members(EngineClient)
    assert {"generate", "alive", "info", "max_context", "restart", "closed"} <= wanted
    for engine in (single, replicas):
        missing = sorted(n for n in wanted if not hasattr(engine, n))
        assert not missing, f"{type(engine).__name__} lacks {missing} of EngineClient"
    assert single.engines() == [single] and replicas.engines() == [single, other]   # what the views iterate
    assert single.live() is None and [r["replica"] for r in replicas.live()] == [0, 1]
    assert replicas.log_path == single.log_path == str(tmp_path / "a.log")


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(EngineFigures) if f.name != "extra"])
def test_every_figure_has_a_place_in_the_logged_form(name):
    fig = EngineFigures(**{name: 1})
    assert fig.as_dict() == {name: 1} and EngineFigures.of(fig.as_dict()) == fig
