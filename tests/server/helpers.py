"""Shared bits of the server tests (fixtures live in conftest.py)."""

import pytest
import tornado.httpclient

TUTORIAL = {
    "cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# Hello GPUs\n", "text"]},
        {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": None, "outputs": [],
         "source": "import nvkit\nnvkit.panel()"},
    ],
    "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
}

NO_AUTH = {"Authorization": ""}


async def fetch_error(coro):
    """The HTTP error a request must end in."""
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await coro
    return e.value
