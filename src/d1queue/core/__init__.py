"""The pure rules: jobs and their defaults, the registry, schedules' cron
rules, bounds and the one name check, configuration, the outbound rules,
the subrequest meter, the handler's context and the log. No I/O and no SQL;
nothing here imports from the layers above (store, features, interfaces)."""
