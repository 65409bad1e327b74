"""compute/ssh.py: ``ssh://user@host:port`` targets."""

from __future__ import annotations

import pytest

from lorapod.compute.ssh import SSHTarget
from lorapod.errors import ProviderError


def test_ssh_target_parse():
    assert SSHTarget.parse("ssh://bob@example.org:2222") == SSHTarget("bob", "example.org", 2222)
    assert SSHTarget.parse("ssh://example.org") == SSHTarget("root", "example.org", 22)
    with pytest.raises(ProviderError):
        SSHTarget.parse("http://x")
