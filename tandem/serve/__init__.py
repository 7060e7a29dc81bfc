"""tandem.serve"""
