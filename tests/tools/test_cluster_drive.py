"""tools/cluster_drive.py's chats and how tools/cluster_figures.py starts them and reads them, without
namespaces or hosts: the first message of each conversation (--first greet|ask), the argument that carries the
choice, and the reuse figures of a phase's rows."""
import json

import pytest

from tools import cluster_drive, cluster_figures


def _firsts(argv, clients=24, convs=3):
    args = cluster_drive.parse(argv)
    return [cluster_drive.first_message(args, c, conv) for c in range(clients) for conv in range(convs)]


def test_greet_is_the_default_and_unchanged():
    assert cluster_drive.parse([]).first == "greet"
    assert cluster_drive.first_message(cluster_drive.parse(["--tag", "a"]), 7, 0) == "Hi, I am a7-0."


def test_ask_is_a_few_words_that_ask_for_something():
    firsts = _firsts(["--first", "ask", "--tag", "a"])
    assert firsts[0] == "I am a0-0. " + cluster_drive.TOPICS[0]
    assert cluster_drive.first_message(cluster_drive.parse(["--first", "ask", "--tag", "a"]), 7, 0) == \
        "I am a7-0. " + cluster_drive.TOPICS[7 % len(cluster_drive.TOPICS)]
    for text in firsts:
        assert len(text.split()) <= 8   # short: the affinity key must hold for a first message of a few words
    assert {t.split(". ", 1)[1] for t in firsts} == set(cluster_drive.TOPICS)   # every topic is asked
    # each conversation's first message is its own (the affinity key differs per conversation), as with greet
    assert len(set(firsts)) == len(firsts)
    assert len(set(_firsts(["--first", "greet"]))) == len(firsts)


def test_an_unknown_first_is_refused():
    for parse in (cluster_drive.parse, cluster_figures.parse):
        with pytest.raises(SystemExit) as e:
            parse(["--first", "hello"])
        assert e.value.code == 2


def test_cluster_figures_passes_first_to_the_drive():
    args = cluster_figures.parse(["--first", "ask", "--max-tokens", "160"])
    argv = cluster_figures.drive_argv(args, "a")
    assert argv[argv.index("--first") + 1] == "ask" and argv[argv.index("--max-tokens") + 1] == "160"
    assert "--seconds" not in argv and "--echo" not in argv
    # the drive parses what cluster_figures builds
    assert cluster_drive.parse(argv[2:]).first == "ask"
    default = cluster_figures.drive_argv(cluster_figures.parse(["--fake"]), "f", seconds=20)
    assert default[default.index("--first") + 1] == "greet" and "--echo" in default
    assert cluster_drive.parse(default[2:]).seconds == 20


def test_ask_body_keeps_messages_last():
    args = cluster_drive.parse(["--first", "ask"])
    body = cluster_drive.body_of([{"role": "user", "content": cluster_drive.first_message(args, 0, 0)}],
                                 stream=True, max_tokens=160)
    assert list(json.loads(body))[-1] == "messages"


def _row(conv, turn, prompt, cached, completion, host="h1", outcome="done"):
    return {"c": 0, "conv": conv, "turn": turn, "outcome": outcome, "prompt": prompt, "cached": cached,
            "completion": completion, "host": host, "crossed": False}


def test_reuse_figures_per_turn_and_reply_lengths():
    rows = [_row(0, 0, 40, 30, 100), _row(0, 1, 150, 138, 20), _row(0, 2, 180, 168, 10),
            _row(1, 0, 40, 30, 20), _row(1, 1, 70, 58, 40, host="h2"), _row(1, 2, 0, 0, 0, outcome="cut")]
    f = cluster_figures.reuse_figures(rows)
    assert f["reuse_per_turn"] == {1: round(196 / 220, 3), 2: round(168 / 180, 3)}   # the cut turn is left out
    assert f["reuse"] == round((138 + 168 + 58) / (150 + 180 + 70), 3)
    assert f["reply_tokens_per_turn"] == {0: 60.0, 1: 30.0, 2: 10.0}   # done replies only
    assert f["lost"] == 1 and f["conversations_on_one_host"] == 1 and f["conversations"] == 2
