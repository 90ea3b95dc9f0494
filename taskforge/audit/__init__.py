"""The audit log: who did which operator action, through which door.

Part of the base so that every app, and the base's own `createapikey`, can
write an entry in the transaction of the action it records
(`taskforge.audit.log.record`).
"""
