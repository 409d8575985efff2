"""creditflow.redaction on hand-written cases: which keys name a secret, nested redaction,
and scrubbing echoed keys out of free text."""

import pytest

from creditflow.redaction import REDACTED, is_secret_key, redact, scrub


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "API_KEY",
        "apiKey",
        "OpenAIKey",
        "apikey",
        "key",
        "hf_token",
        "access-token",
        "client_secret",
        "secret",
        "secrets",
        "db_password",
        "Password",
        "passwd",
        "Authorization",
    ],
)
def test_secret_names(name):
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        # The project's own knobs that contain a secret word but end in another one.
        "num_key_value_heads",
        "max_new_tokens",
        "max_tokens",
        "special_tokens",
        "token_weights",
        "tokenizer",
        "tapo_tokenizer",
        "keys",
        "credentials",  # names an entry of credentials.yml, not a secret
        "secret_name",
        "model",
        "",
        3,
    ],
)
def test_not_secret_names(name):
    assert not is_secret_key(name)


def test_redact_walks_mappings_and_lists_at_any_depth():
    params = {
        "annotation": {
            "annotator": {
                "name": "openai",
                "options": {"API_KEY": "sk-abc", "model": "m", "max_tokens": 512},
            }
        },
        "services": [{"token": "t0k3n", "url": "http://x"}, ("plain", {"password": "pw"})],
        "hf": {"hf_token": None},  # nothing to hide: "no token set" stays readable
        "client_secret": {"id": "x", "value": "y"},  # a whole secret-named mapping goes
        "expmodel": {"num_key_value_heads": 1, "tokenizer": {"vocab_size": 300}},
    }
    assert redact(params) == {
        "annotation": {
            "annotator": {
                "name": "openai",
                "options": {"API_KEY": REDACTED, "model": "m", "max_tokens": 512},
            }
        },
        "services": [{"token": REDACTED, "url": "http://x"}, ["plain", {"password": REDACTED}]],
        "hf": {"hf_token": None},
        "client_secret": REDACTED,
        "expmodel": {"num_key_value_heads": 1, "tokenizer": {"vocab_size": 300}},
    }
    assert params["annotation"]["annotator"]["options"]["API_KEY"] == "sk-abc"  # not in place
    assert redact("sk-abc") == "sk-abc" and redact(None) is None  # only keys say "secret"


def test_scrub_known_secrets_bearer_and_sk_tokens():
    body = (
        '{"error": {"message": "Incorrect API key provided: my-local-key-42. '
        'Header was Authorization: Bearer my-local-key-42; also tried sk-proj-AbC123_xyz-789"}}'
    )
    assert scrub(body, ["my-local-key-42"]) == (
        '{"error": {"message": "Incorrect API key provided: [REDACTED]. '
        'Header was Authorization: Bearer [REDACTED]; also tried [REDACTED]"}}'
    )
    # Without being told the key: the Bearer token and the sk- key still go.
    assert scrub("bearer abc.def-123 then sk-0123456789abcdef") == (
        "bearer [REDACTED] then [REDACTED]"
    )
    # Short, empty and missing secrets are not replaced literally (they would garble text);
    # text without secrets is untouched, "sk-" in ordinary words too.
    assert scrub("a risk-free task", ["a", "", None]) == "a risk-free task"
    assert scrub("see sk-short", []) == "see sk-short"
