"""NOTE [ Credentials from the environment ]: the lean client takes the environment's keys
without building botocore's credential chain (whose container provider makes an SSL
context), and leaves everything else to the chain."""

from __future__ import annotations

import botocore.session
import pytest

from shardstream.storage import s3lean


class NoChain(botocore.session.Session):
    def get_credentials(self):
        raise AssertionError("the credential chain was built")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-env")
    return monkeypatch


def test_the_environment_keys_are_taken_without_the_chain(clean_env):
    clean_env.setenv("AWS_SESSION_TOKEN", "token-env")
    credentials = s3lean._credentials({}, NoChain())
    frozen = credentials.get_frozen_credentials()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == ("AKIDENV", "secret-env", "token-env")


def test_keys_given_as_options_still_come_first(clean_env):
    arguments = {"aws_access_key_id": "AKIDOPT", "aws_secret_access_key": "secret-opt"}
    assert s3lean._credentials(arguments, NoChain()).access_key == "AKIDOPT"


@pytest.mark.parametrize("profile", ["AWS_PROFILE", "AWS_DEFAULT_PROFILE", "session"])
def test_a_named_profile_is_left_to_the_chain(clean_env, profile):
    if profile == "session":
        session = NoChain(profile="other")
    else:
        clean_env.setenv(profile, "other")
        session = NoChain()
    with pytest.raises(AssertionError, match="chain was built"):
        s3lean._credentials({}, session)


def test_no_keys_in_the_environment_is_left_to_the_chain(clean_env):
    clean_env.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(AssertionError, match="chain was built"):
        s3lean._credentials({}, NoChain())
