"""tandem.bench"""
