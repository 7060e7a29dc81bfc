"""tandem.protocols"""
