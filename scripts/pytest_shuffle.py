"""A pytest plugin that runs the tests in a shuffled order, to find tests whose outcome depends on
which tests ran before them (state left in the process: the current session, events, environment
variables, caches, patched modules).

Run (from the checkout; the seed is printed in the header, so an order that fails can be replayed):

    HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -p scripts.pytest_shuffle --shuffle-seed 7 \\
        tests --ignore=tests/ui --ignore=tests/server --ignore=tests/gpu

``--shuffle-seed random`` picks a seed. By default the modules are shuffled and the tests inside
each module are shuffled, but a module's tests stay together: its module-scoped fixtures (a loaded
model) are then set up once, as in a normal run. ``--shuffle-scope all`` mixes every test with
every other (much slower: a module fixture is set up again each time its module comes back).
Without ``--shuffle-seed`` the plugin changes nothing.
"""

from __future__ import annotations

import random


def pytest_addoption(parser):
    group = parser.getgroup("shuffle")
    group.addoption("--shuffle-seed", default=None,
                    help="shuffle the collected tests with this seed (a number, or 'random')")
    group.addoption("--shuffle-scope", default="module", choices=("module", "all"),
                    help="module: shuffle modules and the tests inside each (default); all: every test")


def _seed(config) -> int | None:
    raw = config.getoption("--shuffle-seed")
    if raw is None:
        return None
    if raw == "random":
        if not hasattr(config, "_shuffle_seed"):
            config._shuffle_seed = random.SystemRandom().randrange(10 ** 6)
        return config._shuffle_seed
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"--shuffle-seed takes a whole number or 'random', not {raw!r}") from None


def pytest_report_header(config):
    seed = _seed(config)
    if seed is not None:
        return f"shuffled order: --shuffle-seed {seed} --shuffle-scope {config.getoption('--shuffle-scope')}"
    return None


def pytest_collection_modifyitems(session, config, items):
    seed = _seed(config)
    if seed is None:
        return
    rng = random.Random(seed)
    if config.getoption("--shuffle-scope") == "all":
        rng.shuffle(items)
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = list(modules)
    rng.shuffle(order)
    shuffled = []
    for name in order:
        tests = modules[name]
        rng.shuffle(tests)
        shuffled.extend(tests)
    items[:] = shuffled
