package org.apache.iceberg.rest;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

/**
 * Iceberg's REST catalog test server (RESTCatalogServer, from iceberg-open-api's test fixtures)
 * for Ferry's tests, started on a free port of 127.0.0.1.
 *
 * <pre>
 *   java -cp ... org.apache.iceberg.rest.FerryRestFixture WAREHOUSE_DIR CATALOG_DB [key=value ...]
 * </pre>
 *
 * The backend is Iceberg's JDBC catalog in the SQLite file CATALOG_DB over Hadoop's file IO, so
 * tables may live in local dirs or on HDFS (a table's location is the client's to choose); the
 * key=value pairs are more catalog properties. stdout carries one line, {@code READY
 * http://127.0.0.1:PORT}; the server stops when stdin reaches EOF (so a test that dies takes
 * it along) or on SIGTERM.
 *
 * In package org.apache.iceberg.rest because the server's constructor with a configuration is
 * package-private; the bound port is read from its private Jetty server.
 */
public final class FerryRestFixture {
  public static void main(String[] args) throws Exception {
    if (args.length < 2) {
      System.err.println("usage: FerryRestFixture WAREHOUSE_DIR CATALOG_DB [key=value ...]");
      System.exit(2);
    }
    Map<String, String> config = new HashMap<>();
    config.put("warehouse", args[0]);
    config.put("uri", "jdbc:sqlite:file:" + args[1]);
    config.put("rest.port", "0");
    for (int i = 2; i < args.length; i++) {
      int eq = args[i].indexOf('=');
      if (eq < 1) {
        System.err.println("not key=value: " + args[i]);
        System.exit(2);
      }
      config.put(args[i].substring(0, eq), args[i].substring(eq + 1));
    }
    RESTCatalogServer server = new RESTCatalogServer(config);
    server.start(false);
    Field f = RESTCatalogServer.class.getDeclaredField("httpServer");
    f.setAccessible(true);
    Server jetty = (Server) f.get(server);
    int port = ((ServerConnector) jetty.getConnectors()[0]).getLocalPort();
    System.out.println("READY http://127.0.0.1:" + port);
    System.out.flush();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    try {
      while (in.readLine() != null) {
        // Lines are ignored: only EOF means something.
      }
    } catch (Exception e) {
      // A broken stdin is EOF.
    }
    System.err.println("[iceberg-rest] stdin closed, shutting down");
    server.stop();
    System.exit(0);
  }
}
