"""The conformance kit: strategies, the tolerance table and the float64 reference.

A vendor runs the same property tests on its hardware through these modules.
"""
