"""The checkpoint the model-choice tests load: nvkit's shipped demo model (what users get)."""


def model_path() -> str:
    import nvkit.demo
    return nvkit.demo.path()
