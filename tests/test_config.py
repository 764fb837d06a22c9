import pytest
from pydantic import ValidationError

from redline.config import load_config


def test_yaml_then_environment_wins(tmp_path, monkeypatch):
    path = tmp_path / "r.yaml"
    path.write_text("server: {port: 9100, max_body_bytes: 4096}\n"
                    "models: [{name: m, bundled: smollm2-135m-instruct}]\n")
    cfg = load_config(path)
    assert cfg.server.port == 9100 and cfg.server.max_body_bytes == 4096
    assert cfg.default_model == "m"
    monkeypatch.setenv("REDLINE_SERVER__PORT", "9200")
    cfg = load_config(path)
    assert cfg.server.port == 9200 and cfg.server.max_body_bytes == 4096


def test_defaults_are_the_embedded_models():
    cfg = load_config()
    assert [m.name for m in cfg.models][:2] == ["smollm2-135m-instruct",
                                               "qwen2.5-coder-0.5b-instruct"]
    # both serve chat: `auto` has a chat model at each size
    assert all(m.has("chat") for m in cfg.models)
    base = load_config(models=[{"name": "g", "bundled": "gemma3-270m", "chat_template": "gemma",
                                "capabilities": ["completions"]}])
    assert not base.models[0].has("chat") and base.models[0].has("completions")


def test_a_tier_given_is_merged_over_its_default(tmp_path, monkeypatch):
    """A config that sets one field of one tier keeps every other tier and field as they
    were (a tier missing from the config was a KeyError, a 500, for requests in it)."""
    path = tmp_path / "r.yaml"
    path.write_text("routing: {tiers: {S: {total_s: 5}}}\n")
    tiers = load_config(path).routing.tiers
    default = load_config().routing.tiers
    assert set(tiers) == {"S", "A", "B"}
    assert tiers["S"].total_s == 5 and tiers["S"].ttft_s == default["S"].ttft_s
    assert tiers["S"].max_inflight == default["S"].max_inflight
    assert tiers["A"] == default["A"] and tiers["B"] == default["B"]
    monkeypatch.setenv("REDLINE_ROUTING__TIERS__A__TTFT_S", "2")
    tiers = load_config(path).routing.tiers
    assert tiers["A"].ttft_s == 2 and tiers["A"].max_inflight == default["A"].max_inflight
    path.write_text("routing: {tiers: {S: {total_s: null}}, shed_at: {B: 0.3}}\n")
    cfg = load_config(path).routing
    assert cfg.tiers["S"].total_s is None  # a limit can be lifted
    assert cfg.shed_at == load_config().routing.shed_at | {"B": 0.3}


@pytest.mark.parametrize("text", [
    "server: {port: 70000}",
    "models: [{name: m}]",  # a local model without a path
    "models: [{name: m, bundled: x}, {name: m, bundled: y}]",
    "default_model: nope",
    "sever: {port: 1}",  # a typo is an error, not ignored
    "models: [{name: m, bundled: x, weights: Q9_9}]",  # no such GGUF type
])
def test_bad_config_is_refused(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError):
        load_config(path)
