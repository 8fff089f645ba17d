"""Issue 35: nvkit's routes are governed by the server's Authorizer like Jupyter's own. A server
whose authorizer refuses kernels refuses /api/sessions, and nvkit/api/gpus too (its answer names
kernels, notebook paths, pids and execution state); one that refuses reading contents refuses the
tutorial list. The gpus case fails on the code before (it answered 200)."""

import pytest
from jupyter_server.auth.authorizer import Authorizer

from tests.server.helpers import fetch_error


class DenyKernels(Authorizer):
    """Refuses everything about kernels and sessions, allows the rest."""

    def is_authorized(self, handler, user, action, resource):
        return resource not in ("kernels", "sessions")


class DenyContents(Authorizer):
    def is_authorized(self, handler, user, action, resource):
        return resource != "contents"


@pytest.fixture
def jp_server_config(request):
    authorizer = getattr(request, "param", DenyKernels)
    return {"ServerApp": {"jpserver_extensions": {"nvkit": True}, "authorizer_class": authorizer}}


async def test_a_server_that_denies_kernels_denies_the_gpu_route(jp_fetch, jp_serverapp, monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")
    assert isinstance(jp_serverapp.authorizer, DenyKernels)
    e = await fetch_error(jp_fetch("api", "sessions"))
    assert e.code == 403
    e = await fetch_error(jp_fetch("nvkit", "api", "gpus"))
    assert e.code == 403
    assert b"\"gpus\"" not in e.response.body and b"pid" not in e.response.body  # no status leaked
    r = await jp_fetch("nvkit", "api", "tutorials")  # not a kernel route
    assert r.code == 200


@pytest.mark.parametrize("jp_server_config", [DenyContents], indirect=True)
async def test_a_server_that_denies_contents_denies_the_tutorial_routes(jp_fetch, tutorials, jp_root_dir,
                                                                         monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")
    e = await fetch_error(jp_fetch("api", "contents"))
    assert e.code == 403
    for method, route in (("GET", ["tutorials"]), ("POST", ["tutorials", "00-hello.ipynb"])):
        e = await fetch_error(jp_fetch("nvkit", "api", *route, method=method,
                                       **({"body": ""} if method == "POST" else {})))
        assert e.code == 403, route
    assert not (jp_root_dir / "00-hello.ipynb").exists()
    r = await jp_fetch("nvkit", "api", "gpus")  # not a contents route
    assert r.code == 200
