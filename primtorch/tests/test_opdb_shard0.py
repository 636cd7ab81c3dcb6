"""op_db shard 0 of 4: OpInfos whose op_db index is 0 mod 4, every supported dtype."""

import pytest

import opdb_cases

SHARD = 0


@pytest.mark.parametrize("opinfo,dtype", opdb_cases.cases(SHARD))
def test_opdb(opinfo, dtype):
    opdb_cases.check_case(opinfo, dtype)


def test_pass_rate():
    opdb_cases.check_rate(SHARD)
