"""A claim commits before anything is published: inside a transaction it is refused."""

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError

from timeouts.dispatch.claiming import claim_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_claiming_inside_a_transaction_is_refused():
    with pytest.raises(TransactionManagementError, match="outside transaction.atomic"), transaction.atomic():
        claim_due(10)
    assert claim_due(10) == []
