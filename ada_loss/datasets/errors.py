"""Exceptions raised by the dataset loaders.

Both subclass the built-in exception a caller would naturally catch, so
``except FileNotFoundError`` / ``except ValueError`` keep working.
"""


class DatasetNotFoundError(FileNotFoundError):
    """The data files are not where the loader looked.

    The message names the files and layout that were expected and where to
    obtain them; the loaders in this package never download anything.
    """


class DatasetFormatError(ValueError):
    """A data file exists but is not in the expected format."""
