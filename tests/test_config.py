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
