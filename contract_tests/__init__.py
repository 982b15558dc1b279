"""siglo's contract suite (shipped in the wheel as ``siglo.contract_tests``)."""
