"""Placeholder: partition maintenance (being written)."""


class Report:
    def summary(self):
        return {}


def maintain(using="default"):
    return Report()
