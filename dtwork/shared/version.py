"""dtwork's version, in one place for the package, the server routes and the reports."""

__version__ = "0.1.0"
