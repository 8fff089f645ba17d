"""nvkit's ipywidgets views: thin panels over the core (each with .code())."""
