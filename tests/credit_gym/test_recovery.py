"""Recovery scores on hand-built credit."""

import numpy as np
import pytest

from creditflow.reporting.credit_recovery import credit_rank_correlation, decisive_auc


def test_auc_and_spearman_by_hand():
    decisive = np.array([[True, False, False, True]])
    # |credit| of the decisive tokens 3 and 2 beats the free 1 and 0: AUC 1
    assert decisive_auc(np.array([[3.0, 1.0, 0.0, -2.0]]), decisive)[0] == 1.0
    # one decisive token below one free one: 3 of 4 pairs right
    assert decisive_auc(np.array([[3.0, 2.0, 0.0, 1.0]]), decisive)[0] == 0.75
    # no credit at all: not scored
    assert np.isnan(decisive_auc(np.zeros((1, 4)), decisive)[0])
    rho = credit_rank_correlation(
        np.array([[4.0, 3.0, 2.0, 1.0]]), np.array([[1.0, 2.0, 3.0, 4.0]])
    )
    assert rho[0] == pytest.approx(-1.0)
