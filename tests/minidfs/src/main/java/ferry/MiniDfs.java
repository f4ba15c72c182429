/*
 * A real HDFS for Ferry's tests: one Hadoop MiniDFSCluster (a NameNode, or with --ha an HA pair
 * of NameNodes, and N DataNodes in this JVM), everything on 127.0.0.1.
 *
 * Build (writes $FERRY_MINIDFS_CLASSPATH_FILE, in the cache: the classes + every dependency jar):
 *   . scripts/minidfs.sh && ferry_build_minidfs
 *
 * Run (what ferry_start_minidfs does; a Rust fixture can do the same directly):
 *   java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.net.preferIPv4Stack=true \
 *        -cp "$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")" ferry.MiniDfs \
 *        --name A --base-dir /tmp/x/A --conf-dir /tmp/x/A/conf [--nn-port 0] [--datanodes 1] \
 *        [--log-level WARN] [--conf key=value]... [--ha [--nameservice ns1]] [--kerberos]
 *
 *   --name       label used in log lines only
 *   --base-dir   where the cluster keeps its data (in <base-dir>/dfs, wiped on start and on stop)
 *   --conf-dir   gets core-site.xml (fs.defaultFS) and hdfs-site.xml (dfs.replication=1 ...),
 *                usable as HADOOP_CONF_DIR by clients
 *   --nn-port    NameNode RPC port on 127.0.0.1; 0 (default) = a free one
 *   --datanodes  number of DataNodes (default 1)
 *   --log-level  Hadoop's log level, to stderr (default WARN)
 *   --conf k=v   extra Hadoop setting for the cluster (repeatable); also written to hdfs-site.xml
 *                (e.g. --conf dfs.blocksize=1048576)
 *   --ha         an HA NameNode pair instead of one NameNode: nameservice ns1 (or --nameservice),
 *                NameNode ids nn0 and nn1, each on 127.0.0.1 at a free RPC port (--nn-port must
 *                be 0), shared edits in a local directory under <base-dir>/dfs (as Hadoop's own HA
 *                tests do), no ZKFC (manual failover only). nn0 is made active, nn1 stays standby.
 *                The conf dir then gets a client HA config (no plain dfs.namenode.rpc-address):
 *                  core-site.xml: fs.defaultFS=hdfs://ns1
 *                  hdfs-site.xml: dfs.nameservices=ns1, dfs.ha.namenodes.ns1=nn0,nn1,
 *                    dfs.namenode.rpc-address.ns1.nn0=127.0.0.1:P0, ...ns1.nn1=127.0.0.1:P1,
 *                    dfs.client.failover.proxy.provider.ns1=
 *                      org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider
 *                so clients use hdfs://ns1/ with that dir as HADOOP_CONF_DIR (a Java client needs
 *                the dir on its classpath, as ferry_fsshell does; `-fs hdfs://ns1` alone can't
 *                resolve ns1). Two HA clusters at once need different --nameservice values if a
 *                client is to see both.
 *   --nameservice NAME  the HA nameservice id (default ns1); only with --ha
 *   --kerberos   a kerberized cluster: a KDC in this JVM (Hadoop's MiniKdc, realm EXAMPLE.COM,
 *                UDP on localhost) started before anything else; NameNode and DataNodes log in
 *                as hdfs/localhost (keytab <conf-dir>/hdfs.keytab); RPC and data transfer
 *                protection `privacy` (data encrypted with AES/CTR), block access tokens on.
 *                The conf dir also gets:
 *                  ferry.keytab   the client principal ferry@EXAMPLE.COM
 *                  krb5.conf      for clients (KRB5_CONFIG), with ticket_lifetime from
 *                                 --ticket-lifetime (default 1h), no DNS canonicalization
 *                and core-site.xml / hdfs-site.xml carry the client's security keys
 *                (hadoop.security.authentication=kerberos, dfs.data.transfer.protection=privacy,
 *                dfs.namenode.kerberos.principal). Hadoop's shell as a keytab user:
 *                  java -Djava.security.krb5.conf=CONF/krb5.conf -cp "CONF:$(cat classpath.txt)" \
 *                       ferry.KeytabShell ferry@EXAMPLE.COM CONF/ferry.keytab -ls /
 *   --ticket-lifetime  the client krb5.conf's ticket_lifetime (e.g. 2m); only with --kerberos
 *
 * Protocol: once the cluster is up and out of safe mode, and the conf files are written, exactly
 * one line goes to stdout:
 *   READY hdfs://127.0.0.1:<port>      (with --ha: READY hdfs://ns1, the nameservice URI)
 * Nothing else is written to stdout (all logging goes to stderr), except the answers to FAILOVER:
 * with --ha, a line `FAILOVER` on stdin makes the active NameNode standby and the other one
 * active (and waits until that one is out of safe mode), then writes one line to stdout:
 *   FAILED_OVER nn1                    (the id of the NameNode that is now active)
 * or, if that failed (the details go to stderr):
 *   FAILOVER_FAILED <reason>
 * Outages, each answered by one stdout line once done:
 *   STOP_NAMENODE    -> NAMENODE_STOPPED            (the NameNode process stops; its port refuses)
 *   START_NAMENODE   -> NAMENODE_STARTED host:port  (again, same port, same namespace, out of safe mode)
 *   STOP_DATANODE i  -> DATANODE_STOPPED i          (DataNode i, from 0, stops for good)
 *   or OUTAGE_FAILED <reason>.
 * (~0.1 s; without --ha the answer is `FAILOVER_FAILED not started with --ha`). Clients with the
 * HA conf carry on (the Java client retries on the other NameNode). Other stdin lines are
 * ignored (noted on stderr). scripts/minidfs.sh has ferry_minidfs_failover NAME for this.
 *
 * After READY the process stays up until its stdin reaches EOF (so a parent that keeps the pipe open and dies takes the cluster
 * with it), or it gets SIGTERM/SIGINT; either way the cluster is shut down cleanly and the data
 * directory deleted. Exit code 0 after a clean shutdown, 1 if startup failed.
 *
 * So a fixture spawns it with stdin = a pipe it holds (never /dev/null: EOF at once means
 * "stop"), stdout = a pipe, stderr = a log file (or null), reads lines until "READY " (about 3 s;
 * allow 120 s on a loaded machine), and on drop closes stdin or sends SIGTERM (clean stop in
 * ~0.5 s) or SIGKILL (then <base-dir>/dfs is left behind: use a temp dir). The JVM flags above
 * are optional: C1-only + serial GC start ~1 s faster on 2 cores; RSS is ~250-300 MB.
 *
 * The same classpath also runs Hadoop's shell, e.g.
 *   java -cp "$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")" org.apache.hadoop.fs.FsShell \
 *        -fs hdfs://127.0.0.1:PORT -put localfile /dest
 * and with --ha (the conf dir first on the classpath, so that ns1 resolves):
 *   java -cp "CONF_DIR:$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")" org.apache.hadoop.fs.FsShell \
 *        -put localfile hdfs://ns1/dest
 */
package ferry;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.MiniDFSNNTopology;
import org.apache.hadoop.util.ShutdownHookManager;

public final class MiniDfs {
  private static final String HOST = "127.0.0.1";

  private static volatile MiniDFSCluster cluster;
  /** --kerberos: the KDC, stopped after the cluster. */
  private static volatile org.apache.hadoop.minikdc.MiniKdc kdc;
  private static final AtomicBoolean stopped = new AtomicBoolean();
  private static final CountDownLatch stop = new CountDownLatch(1);
  private static String name = "minidfs";
  private static PrintStream out;
  /** --ha: the nameservice id and the NameNode ids, in MiniDFSCluster's NameNode index order. */
  private static String nameservice;
  private static final String[] HA_NN_IDS = {"nn0", "nn1"};
  /** Held while the cluster changes state (FAILOVER, shutdown), so the two never overlap. */
  private static final Object stateLock = new Object();

  public static void main(String[] argv) throws Exception {
    // stdout carries only the READY line: everything else (Hadoop, MiniDFSCluster) goes to stderr.
    out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
        StandardCharsets.UTF_8);
    System.setOut(System.err);

    Map<String, String> extra = new LinkedHashMap<>();
    Map<String, String> args = parseArgs(argv, extra);
    name = args.getOrDefault("name", "minidfs");
    String baseDirArg = args.get("base-dir");
    String confDirArg = args.get("conf-dir");
    if (baseDirArg == null || confDirArg == null) {
      usage("--base-dir and --conf-dir are required");
    }
    int nnPort = Integer.parseInt(args.getOrDefault("nn-port", "0"));
    int dataNodes = Integer.parseInt(args.getOrDefault("datanodes", "1"));
    boolean ha = args.containsKey("ha");
    boolean kerberos = args.containsKey("kerberos");
    if (args.containsKey("ticket-lifetime") && !kerberos) {
      usage("--ticket-lifetime needs --kerberos");
    }
    if (ha) {
      nameservice = args.getOrDefault("nameservice", "ns1");
      if (!nameservice.matches("[A-Za-z0-9][A-Za-z0-9_-]*")) {
        usage("bad --nameservice " + nameservice);
      }
      if (nnPort != 0) {
        usage("--ha picks free ports itself: --nn-port must be 0");
      }
    } else if (args.containsKey("nameservice")) {
      usage("--nameservice needs --ha");
    }
    configureLogging(args.getOrDefault("log-level", "WARN"));

    Path baseDir = Path.of(baseDirArg).toAbsolutePath();
    Path confDir = Path.of(confDirArg).toAbsolutePath();
    Path dfsDir = baseDir.resolve("dfs");
    Path tmpDir = baseDir.resolve("tmp");
    Files.createDirectories(baseDir);
    Files.createDirectories(confDir);
    Files.createDirectories(tmpDir);
    // Some Hadoop test helpers fall back to these; keep them inside base-dir so that two clusters
    // never share a directory.
    System.setProperty("test.build.data", tmpDir.toString());
    System.setProperty("hadoop.tmp.dir", tmpDir.toString());
    System.setProperty("java.io.tmpdir", tmpDir.toString());

    // The KDC first: Java reads the Kerberos config (and Hadoop caches the default realm) the
    // first time anything asks, and MiniKdc points java.security.krb5.conf at its own file.
    Map<String, String> security = new LinkedHashMap<>();
    if (kerberos) {
      try {
        startKdc(baseDir, confDir, args.getOrDefault("ticket-lifetime", "1h"), security);
      } catch (Throwable t) {
        System.err.println("[minidfs " + name + "] KDC startup failed: " + t);
        t.printStackTrace(System.err);
        System.exit(1);
      }
    }

    Map<String, String> hdfsSite = new LinkedHashMap<>();
    hdfsSite.put("dfs.replication", "1");
    hdfsSite.put("dfs.permissions.enabled", "false");
    hdfsSite.put("dfs.webhdfs.enabled", "false");
    // Clients connect to DataNodes by the IP they registered with (127.0.0.1).
    hdfsSite.put("dfs.client.use.datanode.hostname", "false");
    // One DataNode: no replacement exists, so don't try to find one when a pipeline fails.
    hdfsSite.put("dfs.client.block.write.replace-datanode-on-failure.enable", "false");
    // 16 MiB blocks (Hadoop's default is 128 MiB). The NameNode places a new block only on a
    // DataNode whose free disk covers a whole block for every block scheduled on it, and an
    // abandoned write (a reset mid-block, as the fault tests make on purpose) can stay scheduled
    // for up to 20 minutes. At 128 MiB, ~40 of those on a disk with 5 GB free exclude the only
    // DataNode ("could only be written to 0 of the 1 minReplication nodes"). In the client
    // config too, so that Java clients (FsShell) write the same blocks as Ferry, which takes the
    // NameNode's default. `--conf dfs.blocksize=...` overrides it.
    hdfsSite.put("dfs.blocksize", Long.toString(16L << 20));

    Configuration conf = new HdfsConfiguration();
    conf.set("hadoop.tmp.dir", tmpDir.toString());
    conf.set("hadoop.security.authentication", "simple");
    hdfsSite.putAll(security);
    for (Map.Entry<String, String> e : hdfsSite.entrySet()) {
      conf.set(e.getKey(), e.getValue());
    }
    // Everything on loopback (MiniDFSCluster already binds DataNodes to 127.0.0.1:0).
    conf.set("dfs.namenode.http-address", HOST + ":0");
    conf.set("dfs.namenode.https-address", HOST + ":0");
    conf.set("dfs.namenode.secondary.http-address", HOST + ":0");
    conf.set("dfs.datanode.hostname", HOST);
    // Start fast: no safe-mode extension, quick heartbeats, immediate first block report.
    conf.setInt("dfs.namenode.safemode.extension", 0);
    conf.setInt("dfs.namenode.safemode.min.datanodes", 0);
    conf.setLong("dfs.heartbeat.interval", 1);
    conf.setLong("dfs.blockreport.initialDelay", 0);
    conf.setInt("dfs.datanode.scan.period.hours", -1);
    conf.setBoolean("dfs.namenode.audit.log.async", false);
    // Small cluster, small JVM.
    conf.setInt("dfs.namenode.handler.count", 10);
    conf.setInt("dfs.namenode.service.handler.count", 4);
    conf.setInt("dfs.datanode.handler.count", 4);
    conf.set("dfs.datanode.du.reserved", "0");
    for (Map.Entry<String, String> e : extra.entrySet()) {
      conf.set(e.getKey(), e.getValue());
      hdfsSite.put(e.getKey(), e.getValue());
    }

    long t0 = System.nanoTime();
    try {
      MiniDFSCluster.Builder builder = new MiniDFSCluster.Builder(conf, dfsDir.toFile());
      if (ha) {
        // Both NameNodes on ports 0 (race-free): MiniDFSCluster then records the bound addresses
        // in the conf the DataNodes get, and (no fixed IPC ports) turns off the standby's
        // checkpoints and log-roll requests, which a test cluster doesn't need. Shared edits:
        // a local directory (manageNameDfsSharedDirs, the default), as in Hadoop's HA tests.
        builder.nnTopology(new MiniDFSNNTopology().addNameservice(
            new MiniDFSNNTopology.NSConf(nameservice)
                .addNN(new MiniDFSNNTopology.NNConf(HA_NN_IDS[0]))
                .addNN(new MiniDFSNNTopology.NNConf(HA_NN_IDS[1]))));
      } else {
        builder.nameNodePort(nnPort);
      }
      cluster = builder
          .numDataNodes(dataNodes)
          .storagesPerDatanode(1)
          .format(true)
          .manageNameDfsDirs(true)
          .manageDataDfsDirs(true)
          .waitSafeMode(true)
          .checkExitOnShutdown(false)
          .build();
      cluster.waitActive();
      if (ha) {
        // HA NameNodes start as standby.
        cluster.transitionToActive(0);
        waitOutOfSafeMode(0, 60_000);
      }
    } catch (Throwable t) {
      System.err.println("[minidfs " + name + "] startup failed: " + t);
      t.printStackTrace(System.err);
      shutdown();
      System.exit(1);
    }
    String uri;
    String where;
    if (ha) {
      uri = "hdfs://" + nameservice;
      hdfsSite.put("dfs.nameservices", nameservice);
      hdfsSite.put("dfs.ha.namenodes." + nameservice, String.join(",", HA_NN_IDS));
      StringBuilder w = new StringBuilder();
      for (int i = 0; i < HA_NN_IDS.length; i++) {
        String addr = HOST + ":" + cluster.getNameNodePort(i);
        hdfsSite.put("dfs.namenode.rpc-address." + nameservice + "." + HA_NN_IDS[i], addr);
        w.append(i == 0 ? " (" : ", ").append(HA_NN_IDS[i]).append('=').append(addr)
            .append(i == 0 ? " active" : " standby");
      }
      hdfsSite.put("dfs.client.failover.proxy.provider." + nameservice,
          "org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider");
      where = uri + w + ")";
    } else {
      int port = cluster.getNameNodePort();
      uri = "hdfs://" + HOST + ":" + port;
      hdfsSite.put("dfs.namenode.rpc-address", HOST + ":" + port);
      // Its web server too (bound to port 0 above): bench/compare.sh reads the NameNode's RPC
      // counters from its /jmx page.
      java.net.InetSocketAddress http = cluster.getNameNode().getHttpAddress();
      hdfsSite.put("dfs.namenode.http-address", HOST + ":" + http.getPort());
      where = uri;
    }

    Map<String, String> coreSite = new LinkedHashMap<>();
    coreSite.put("fs.defaultFS", uri);
    coreSite.put("hadoop.security.authentication", kerberos ? "kerberos" : "simple");
    if (kerberos) {
      coreSite.put("hadoop.rpc.protection", security.get("hadoop.rpc.protection"));
    }
    writeSite(confDir.resolve("core-site.xml"), coreSite);
    writeSite(confDir.resolve("hdfs-site.xml"), hdfsSite);

    // Stop on SIGTERM/SIGINT: the main thread stops the cluster, then exits. Not from a shutdown
    // hook: while the JVM is shutting down, the DataNode's Hadoop code fails to remove its own
    // shutdown hooks (IllegalStateException), the cluster's shutdown throws, and <base-dir>/dfs
    // stays behind. The hook remains as a fallback (a signal before this point, System.exit) ...
    ShutdownHookManager.get().addShutdownHook(MiniDfs::shutdown, 1000);
    for (String sig : new String[] {"TERM", "INT"}) {
      try {
        sun.misc.Signal.handle(new sun.misc.Signal(sig), s -> {
          System.err.println("[minidfs " + name + "] SIG" + sig + ", shutting down");
          stop.countDown();
        });
      } catch (Throwable t) {
        System.err.println("[minidfs " + name + "] can't handle SIG" + sig + " (" + t + "); the shutdown hook will do");
      }
    }
    // ... or when stdin reaches EOF.
    Thread stdinWatcher = new Thread(() -> {
      try {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
          line = line.trim();
          if (line.equals("FAILOVER")) {
            if (ha) {
              failover();
            } else {
              System.err.println("[minidfs " + name + "] FAILOVER needs --ha");
              out.println("FAILOVER_FAILED not started with --ha");
              out.flush();
            }
          } else if (line.equals("STOP_NAMENODE") || line.equals("START_NAMENODE")
              || line.startsWith("STOP_DATANODE")) {
            outage(line, ha);
          } else if (!line.isEmpty()) {
            System.err.println("[minidfs " + name + "] ignoring stdin line: " + line);
          }
        }
      } catch (IOException ignored) {
        // treat a broken stdin as EOF
      }
      System.err.println("[minidfs " + name + "] stdin closed, shutting down");
      stop.countDown();
    }, "minidfs-stdin");
    stdinWatcher.setDaemon(true);
    stdinWatcher.start();

    System.err.printf("[minidfs %s] up at %s with %d datanode(s) in %.1f s (data in %s, conf in %s)%n",
        name, where, dataNodes, (System.nanoTime() - t0) / 1e9, dfsDir, confDir);
    out.println("READY " + uri);
    out.flush();

    stop.await();
    shutdown();
    System.exit(0);
  }

  /** --kerberos: the KDC, the principals and keytabs, and the cluster's security settings
   *  (into `security`, later also written to hdfs-site.xml). */
  private static void startKdc(Path baseDir, Path confDir, String ticketLifetime, Map<String, String> security)
      throws Exception {
    Path kdcDir = baseDir.resolve("kdc");
    Files.createDirectories(kdcDir);
    Properties kp = org.apache.hadoop.minikdc.MiniKdc.createConf();
    kdc = new org.apache.hadoop.minikdc.MiniKdc(kp, kdcDir.toFile());
    // UDP, as hdfs-native's own kerberized tests run it against MIT's client library.
    kdc.setTransport("UDP");
    kdc.start();
    String realm = kdc.getRealm();
    // One call per keytab: createPrincipal rewrites the file.
    Path hdfsKeytab = confDir.resolve("hdfs.keytab");
    kdc.createPrincipal(hdfsKeytab.toFile(), "hdfs/localhost", "HTTP/localhost");
    kdc.createPrincipal(confDir.resolve("ferry.keytab").toFile(), "ferry");
    // The clients' krb5.conf: MiniKdc's (deleted with its work dir), plus a ticket lifetime a
    // test can make short, and no DNS at all. MIT's library asks DNS for the realm's primary KDC
    // after every ticket reply unless told not to (dns_lookup_kdc, dns_uri_lookup): on a machine
    // whose resolver does not answer, each new NameNode connection then waited 5-15 s for SRV
    // and URI queries, and a few of them in a row ran past a call's 30 s deadline.
    String krb5 = Files.readString(kdc.getKrb5conf().toPath(), StandardCharsets.UTF_8);
    krb5 = krb5.replaceFirst("\\[libdefaults\\]", "[libdefaults]\n    ticket_lifetime = " + ticketLifetime
        + "\n    dns_canonicalize_hostname = false\n    rdns = false"
        + "\n    dns_lookup_kdc = false\n    dns_lookup_realm = false\n    dns_uri_lookup = false");
    Files.writeString(confDir.resolve("krb5.conf"), krb5, StandardCharsets.UTF_8);
    // A literal host in the principals: _HOST would become 127.0.0.1 for the DataNode
    // (dfs.datanode.hostname), which is not in the keytab.
    String hdfsPrincipal = "hdfs/localhost@" + realm;
    security.put("hadoop.security.authentication", "kerberos");
    security.put("hadoop.security.authorization", "true");
    security.put("hadoop.rpc.protection", "privacy");
    security.put("dfs.data.transfer.protection", "privacy");
    security.put("dfs.encrypt.data.transfer.cipher.suites", "AES/CTR/NoPadding");
    security.put("dfs.block.access.token.enable", "true");
    security.put("dfs.namenode.kerberos.principal", hdfsPrincipal);
    security.put("dfs.namenode.keytab.file", hdfsKeytab.toString());
    security.put("dfs.datanode.kerberos.principal", hdfsPrincipal);
    security.put("dfs.datanode.keytab.file", hdfsKeytab.toString());
    security.put("dfs.web.authentication.kerberos.principal", "HTTP/localhost@" + realm);
    // No privileged ports or HTTPS for the DataNode: SASL on data transfer is the protection.
    security.put("ignore.secure.ports.for.testing", "true");
    security.put("ipc.client.connect.max.retries.on.sasl", "10");
    // Idle RPC connections close after 2 x this: clients reconnect, and log in again (what
    // a short ticket lifetime is to exercise).
    security.put("ipc.client.connection.maxidletime", "5000");
    System.err.println("[minidfs " + name + "] KDC up, realm " + realm + ", keytabs and krb5.conf in " + confDir);
  }

  private static void shutdown() {
    if (!stopped.compareAndSet(false, true)) {
      return;
    }
    synchronized (stateLock) { // let a FAILOVER in progress finish (it gives up once stopped)
      MiniDFSCluster c = cluster;
      if (c != null) {
        try {
          c.shutdown(true); // also deletes <base-dir>/dfs
          System.err.println("[minidfs " + name + "] stopped");
        } catch (Throwable t) {
          System.err.println("[minidfs " + name + "] shutdown: " + t);
        }
      }
      if (kdc != null) {
        kdc.stop();
      }
    }
  }

  /** --ha, stdin line FAILOVER: active -> standby, the other -> active; answers on stdout. */
  private static void failover() {
    synchronized (stateLock) {
      if (stopped.get()) {
        return;
      }
      long t0 = System.nanoTime();
      try {
        int from = -1;
        for (int i = 0; i < HA_NN_IDS.length; i++) {
          if (cluster.getNameNode(i).isActiveState()) {
            from = i;
          }
        }
        int to = from < 0 ? 0 : (from + 1) % HA_NN_IDS.length;
        if (from >= 0) {
          cluster.transitionToStandby(from);
        }
        cluster.transitionToActive(to);
        waitOutOfSafeMode(to, 30_000);
        System.err.printf("[minidfs %s] failed over %s -> %s in %.2f s%n", name,
            from < 0 ? "(none active)" : HA_NN_IDS[from], HA_NN_IDS[to], (System.nanoTime() - t0) / 1e9);
        out.println("FAILED_OVER " + HA_NN_IDS[to]);
      } catch (Throwable t) {
        System.err.println("[minidfs " + name + "] FAILOVER failed: " + t);
        t.printStackTrace(System.err);
        out.println("FAILOVER_FAILED " + String.valueOf(t).replace('\n', ' '));
      }
      out.flush();
    }
  }

  /**
   * STOP_NAMENODE: the (first) NameNode process stops, its port refuses connections, the
   * DataNodes keep running and retry. START_NAMENODE: it starts again on the same port from its
   * own fsimage and edits (nothing is formatted), and answers once it is out of safe mode.
   * STOP_DATANODE i: DataNode i stops for good (a lost machine). Each answers one stdout line:
   * NAMENODE_STOPPED, NAMENODE_STARTED, DATANODE_STOPPED i, or OUTAGE_FAILED reason.
   */
  private static void outage(String line, boolean ha) {
    synchronized (stateLock) {
      if (stopped.get()) {
        return;
      }
      long t0 = System.nanoTime();
      String answer;
      try {
        if (line.equals("STOP_NAMENODE")) {
          cluster.shutdownNameNode(0);
          answer = "NAMENODE_STOPPED";
        } else if (line.equals("START_NAMENODE")) {
          cluster.restartNameNode(0, true);
          if (ha) {
            cluster.transitionToActive(0);
          }
          waitOutOfSafeMode(0, 120_000);
          answer = "NAMENODE_STARTED " + HOST + ":" + cluster.getNameNodePort(0);
        } else {
          int i = Integer.parseInt(line.substring("STOP_DATANODE".length()).trim());
          MiniDFSCluster.DataNodeProperties dn = cluster.stopDataNode(i);
          if (dn == null) {
            throw new IllegalArgumentException("no DataNode " + i);
          }
          answer = "DATANODE_STOPPED " + i;
        }
        System.err.printf("[minidfs %s] %s in %.2f s%n", name, answer, (System.nanoTime() - t0) / 1e9);
      } catch (Throwable t) {
        System.err.println("[minidfs " + name + "] " + line + " failed: " + t);
        t.printStackTrace(System.err);
        answer = "OUTAGE_FAILED " + String.valueOf(t).replace('\n', ' ');
      }
      out.println(answer);
      out.flush();
    }
  }

  private static void waitOutOfSafeMode(int nn, long timeoutMs) throws Exception {
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (cluster.getNameNode(nn).isInSafeMode()) {
      if (stopped.get()) {
        throw new IllegalStateException("stopping");
      }
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException(HA_NN_IDS[nn] + " still in safe mode after " + timeoutMs + " ms");
      }
      Thread.sleep(20);
    }
  }

  private static void writeSite(Path file, Map<String, String> props) throws IOException {
    StringBuilder sb = new StringBuilder();
    sb.append("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<configuration>\n");
    for (Map.Entry<String, String> e : props.entrySet()) {
      sb.append("  <property><name>").append(e.getKey()).append("</name><value>")
          .append(e.getValue()).append("</value></property>\n");
    }
    sb.append("</configuration>\n");
    Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
    Files.writeString(tmp, sb.toString(), StandardCharsets.UTF_8);
    Files.move(tmp, file, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
        java.nio.file.StandardCopyOption.ATOMIC_MOVE);
  }

  /** Hadoop logs through log4j 1 (reload4j); send it to stderr, whatever log4j.properties the
   *  classpath has first (Hadoop's test jars carry ones that log INFO to stdout). */
  private static void configureLogging(String level) {
    Properties p = new Properties();
    p.setProperty("log4j.rootLogger", level + ",stderr");
    p.setProperty("log4j.appender.stderr", "org.apache.log4j.ConsoleAppender");
    p.setProperty("log4j.appender.stderr.Target", "System.err");
    p.setProperty("log4j.appender.stderr.layout", "org.apache.log4j.PatternLayout");
    p.setProperty("log4j.appender.stderr.layout.ConversionPattern",
        "%d{HH:mm:ss.SSS} %-5p [" + name + "] %c{2}: %m%n");
    p.setProperty("log4j.logger.org.apache.hadoop.util.NativeCodeLoader", "ERROR");
    p.setProperty("log4j.logger.org.apache.hadoop.metrics2", "ERROR");
    org.apache.log4j.LogManager.resetConfiguration();
    org.apache.log4j.PropertyConfigurator.configure(p);
  }

  private static Map<String, String> parseArgs(String[] argv, Map<String, String> extra) {
    Map<String, String> m = new LinkedHashMap<>();
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      if (!a.startsWith("--")) {
        usage("unexpected argument " + a);
      }
      String key = a.substring(2);
      String value;
      int eq = key.indexOf('=');
      if (eq >= 0) {
        value = key.substring(eq + 1);
        key = key.substring(0, eq);
      } else if (key.equals("ha") || key.equals("kerberos")) {
        value = "true"; // a flag
      } else {
        if (i + 1 >= argv.length) {
          usage("missing value for " + a);
        }
        value = argv[++i];
      }
      switch (key) {
        case "name", "base-dir", "conf-dir", "nn-port", "datanodes", "log-level", "nameservice", "ticket-lifetime" ->
            m.put(key, value);
        case "ha", "kerberos" -> {
          if (!value.equals("true")) {
            usage("--" + key + " takes no value");
          }
          m.put(key, value);
        }
        case "conf" -> {
          int kv = value.indexOf('=');
          if (kv <= 0) {
            usage("--conf wants key=value, got " + value);
          }
          extra.put(value.substring(0, kv), value.substring(kv + 1));
        }
        default -> usage("unknown option --" + key);
      }
    }
    return m;
  }

  private static void usage(String why) {
    System.err.println("minidfs: " + why);
    System.err.println("usage: ferry.MiniDfs --name A --base-dir DIR --conf-dir DIR"
        + " [--nn-port N (0 = free)] [--datanodes 1] [--log-level WARN] [--conf key=value]..."
        + " [--ha [--nameservice ns1]] [--kerberos [--ticket-lifetime 1h]]");
    System.exit(2);
  }

  private MiniDfs() {}
}
