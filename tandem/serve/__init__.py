"""tandem.serve: the long-running sides of a deployment.

cloud.py           CloudServer: accepts device sessions over tandem.transport and hands
                   each one, by its first message, to a *mode* from a small registry
                   (`MODES`: spec, ar, dragon; RAPID plugs in the same way).
device.py          the device runtime: connect, run one generation in a mode, report.
dragon_session.py  DRAGON's sides as processes (corpus loading, ready file).
dragon_demo.py     `tandem demo`: a DRAGON cloud and device on loopback.
"""
