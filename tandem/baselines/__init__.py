"""tandem.baselines"""
