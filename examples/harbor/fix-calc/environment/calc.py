def add(a, b):
    """The sum of a and b."""
    return a - b


def mul(a, b):
    return a * b
