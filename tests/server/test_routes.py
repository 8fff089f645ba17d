"""nvkit's REST routes on a real (in-process) Jupyter server: payloads with fake GPUs, auth on every
route, XSRF on POST, and no way out of the served root."""

import json

import pytest
import tornado.httpclient

from tests.server.helpers import NO_AUTH, TUTORIAL, fetch_error


@pytest.fixture
def fake_gpus(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")


ROUTES = [("GET", "gpus"), ("GET", "tutorials"), ("POST", "tutorials/00-hello.ipynb")]


# ---- payloads -----------------------------------------------------------------------------------

async def test_gpus_payload_with_fake_gpus(jp_fetch, fake_gpus):
    r = await jp_fetch("nvkit", "api", "gpus")
    assert r.code == 200
    data = json.loads(r.body)
    assert data["count"] == 4 and len(data["gpus"]) == 4
    assert data["reason"] is None
    g = data["gpus"][0]
    for key in ("index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used",
                "memory_free", "utilization", "processes"):
        assert key in g, key
    assert [g["index"] for g in data["gpus"]] == [0, 1, 2, 3]
    assert 0 <= g["memory_used"] <= g["memory_total"]
    assert r.headers["Cache-Control"] == "no-store"


async def test_gpus_payload_without_gpus_says_why(jp_fetch, monkeypatch):
    import importlib
    from nvkit.server import handlers
    gpus_mod = importlib.import_module("nvkit.hardware.inventory")
    monkeypatch.setattr(gpus_mod, "gpus", lambda: [])
    r = await jp_fetch("nvkit", "api", "gpus")
    data = json.loads(r.body)
    assert data["gpus"] == [] and data["count"] == 0
    assert isinstance(data["reason"], str) and data["reason"]
    assert handlers.gpu_status()["reason"]


async def test_tutorials_payload(jp_fetch, tutorials):
    r = await jp_fetch("nvkit", "api", "tutorials")
    data = json.loads(r.body)["tutorials"]
    assert [t["name"] for t in data] == ["00-hello.ipynb", "01-untitled.ipynb"]
    assert data[0]["title"] == "Hello GPUs"
    assert data[1]["title"] == "01-untitled"          # no heading: the file name


async def test_shipped_tutorials_are_found(jp_fetch, monkeypatch):
    monkeypatch.delenv("NVKIT_TUTORIALS_DIR", raising=False)
    r = await jp_fetch("nvkit", "api", "tutorials")
    names = [t["name"] for t in json.loads(r.body)["tutorials"]]
    assert "00-start-here.ipynb" in names


async def test_copy_tutorial_then_ask_before_overwriting(jp_fetch, tutorials, jp_root_dir):
    r = await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST", body="")
    assert r.code == 201
    assert json.loads(r.body)["path"] == "00-hello.ipynb"
    copied = jp_root_dir / "00-hello.ipynb"
    assert json.loads(copied.read_text())["cells"][0]["source"][0].startswith("# Hello")

    copied.write_text(json.dumps(dict(TUTORIAL, cells=[])))          # the user's edits
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb",
                                   method="POST", body=""))
    assert e.code == 409
    assert json.loads(e.response.body)["path"] == "00-hello.ipynb"
    assert json.loads(copied.read_text())["cells"] == []           # untouched

    r = await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST", body="",
                       params={"overwrite": "true"})
    assert r.code == 200 and json.loads(r.body)["overwritten"] is True
    assert len(json.loads(copied.read_text())["cells"]) == 2


async def test_copy_into_a_subfolder(jp_fetch, tutorials, jp_root_dir):
    (jp_root_dir / "work").mkdir()
    r = await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                       body=json.dumps({"dir": "work"}))
    assert json.loads(r.body)["path"] == "work/00-hello.ipynb"
    assert (jp_root_dir / "work" / "00-hello.ipynb").is_file()


async def test_unknown_tutorial_is_404(jp_fetch, tutorials):
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "nope.ipynb", method="POST", body=""))
    assert e.code == 404
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "notes.txt", method="POST", body=""))
    assert e.code == 404


# ---- authentication and XSRF ---------------------------------------------------------------------

@pytest.mark.parametrize("method,route", ROUTES)
async def test_every_route_needs_credentials(jp_fetch, tutorials, fake_gpus, jp_root_dir,
                                             method, route):
    kw = {"body": ""} if method == "POST" else {}
    e = await fetch_error(jp_fetch("nvkit", "api", *route.split("/"), method=method,
                                   headers=NO_AUTH, **kw))
    assert e.code == 403
    assert not (jp_root_dir / "00-hello.ipynb").exists()


@pytest.mark.parametrize("method,route", ROUTES)
async def test_a_wrong_token_is_refused(jp_fetch, tutorials, method, route):
    kw = {"body": ""} if method == "POST" else {}
    e = await fetch_error(jp_fetch("nvkit", "api", *route.split("/"), method=method,
                                   headers={"Authorization": "token not-the-token"}, **kw))
    assert e.code == 403


async def _login_cookies(jp_fetch, jp_serverapp) -> dict:
    """Log in the way a browser does (token once in the URL) and return its cookies."""
    token = jp_serverapp.identity_provider.token
    r = await jp_fetch("nvkit", "api", "gpus", headers=NO_AUTH, params={"token": token})
    cookies = {}
    for h in r.headers.get_list("Set-Cookie"):
        k, _, v = h.split(";", 1)[0].partition("=")
        cookies[k] = v
    return cookies


async def test_post_with_cookie_but_without_xsrf_fails(jp_fetch, jp_serverapp, tutorials, fake_gpus,
                                                       jp_root_dir):
    cookies = await _login_cookies(jp_fetch, jp_serverapp)
    login = [k for k in cookies if k.startswith("username-")]
    assert login, cookies
    cookie_header = "; ".join(f"{k}={v}" for k, v in cookies.items() if k != "_xsrf")
    # a cookie-authenticated GET works (so the cookie is a real login) ...
    r = await jp_fetch("nvkit", "api", "gpus", headers={**NO_AUTH, "Cookie": cookie_header})
    assert r.code == 200
    # ... but a POST with the same cookie and no XSRF token is refused
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body="", headers={**NO_AUTH, "Cookie": cookie_header}))
    assert e.code == 403
    assert not (jp_root_dir / "00-hello.ipynb").exists()
    # a mismatching XSRF header is refused too
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body="", headers={**NO_AUTH, "Cookie": cookie_header + "; _xsrf=abc",
                                                     "X-XSRFToken": "def"}))
    assert e.code == 403
    assert not (jp_root_dir / "00-hello.ipynb").exists()


async def test_post_with_cookie_and_xsrf_works(jp_fetch, jp_serverapp, tutorials, jp_root_dir):
    cookies = await _login_cookies(jp_fetch, jp_serverapp)
    xsrf = "2|deadbeef|0123456789abcdef0123456789abcdef|1700000000"
    cookie_header = "; ".join(f"{k}={v}" for k, v in cookies.items() if k != "_xsrf")
    r = await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST", body="",
                       headers={**NO_AUTH, "Cookie": f"{cookie_header}; _xsrf={xsrf}",
                                "X-XSRFToken": xsrf})
    assert r.code == 201
    assert (jp_root_dir / "00-hello.ipynb").is_file()


# ---- path traversal -------------------------------------------------------------------------------

TRAVERSAL_NAMES = [
    "..%2F..%2Fetc%2Fpasswd",
    "..%2f00-hello.ipynb",
    "%2e%2e%2F00-hello.ipynb",
    "%2e%2e",
    "..",
    "%2Fetc%2Fpasswd",
    "%2Ftmp%2F00-hello.ipynb",
    "sub%2F00-hello.ipynb",
    "..%5C00-hello.ipynb",
    "%252e%252e%252F00-hello.ipynb",
    ".hidden.ipynb",
]


@pytest.mark.parametrize("raw", TRAVERSAL_NAMES)
async def test_traversal_in_the_name_is_refused(jp_serverapp, http_server_client, jp_auth_header,
                                                jp_base_url, tutorials, jp_root_dir, raw):
    # raw URL (jp_fetch would escape the '%'), so the server sees exactly these bytes
    url = f"{jp_base_url}nvkit/api/tutorials/{raw}"
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await http_server_client.fetch(url, method="POST", body="", headers=jp_auth_header)
    assert e.value.code in (400, 404)
    assert sorted(p.name for p in jp_root_dir.iterdir()) == []


@pytest.mark.parametrize("folder", [
    "../", "..", "../outside", "sub/../../x", "/tmp", "/", "//tmp", "~", "~/x", "C:/x",
    "..\\x", ".hidden", "a/.git", "%2e%2e", "a\x00b", 7, ["x"],
])
async def test_traversal_in_the_target_folder_is_refused(jp_fetch, tutorials, jp_root_dir, tmp_path,
                                                         folder):
    (jp_root_dir / "sub").mkdir()
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body=json.dumps({"dir": folder})))
    assert e.code in (400, 404)
    assert list(tmp_path.rglob("00-hello.ipynb")) == [tutorials / "00-hello.ipynb"]


async def test_bad_bodies_are_400(jp_fetch, tutorials):
    for body in ("not json", "[1, 2]"):
        e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb",
                                       method="POST", body=body))
        assert e.code == 400


async def test_copy_needs_contents_write_permission(jp_fetch, jp_serverapp, tutorials, jp_root_dir,
                                                    monkeypatch):
    # a read-only user (an authorizer that refuses writing contents) may list but not copy
    monkeypatch.setattr(jp_serverapp.authorizer, "is_authorized",
                        lambda handler, user, action, resource:
                        not (resource == "contents" and action == "write"))
    r = await jp_fetch("nvkit", "api", "tutorials")
    assert r.code == 200
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body=""))
    assert e.code == 403
    assert not (jp_root_dir / "00-hello.ipynb").exists()
